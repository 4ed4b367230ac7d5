"""The command line: exit codes and one-line errors a user can act on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import BAD_FILES, S3_SECRET, holds_secret, storage_option_args
from manifests import listed_manifest

from cachekit.cli import main
from cachekit.image.recipes import OPS, builtin_pipelines, load_pipeline


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_build_then_info(small_tree, tmp_path):
    code, out = run("build", small_tree, "--out", tmp_path / "c", "--size", 32, "--workers", 1, "--quiet")
    assert code == 0, out
    assert "40 samples, 0 skipped" in out
    code, out = run("info", tmp_path / "c")
    assert code == 0 and "uint8 [3, 32, 32]" in out and "class_000" in out


def test_bad_files_are_reported_and_strict_fails(mixed_tree, tmp_path):
    code, out = run("build", mixed_tree, "--out", tmp_path / "c", "--size", 32, "--quiet")
    assert code == 0 and f"{len(BAD_FILES)} skipped" in out
    code, out = run("build", mixed_tree, "--out", tmp_path / "s", "--size", 32, "--quiet", "--strict")
    assert code == 1
    for path in BAD_FILES:
        assert path in out
    assert not (tmp_path / "s" / "manifest.json").exists()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing-raw", "does not exist"),
        ("no-images", "holds no images"),
        ("unknown-pipeline", "unknown pipeline"),
        ("unknown-format", "unknown format"),
        ("non-empty-out", "not empty"),
    ],
)
def test_user_errors_exit_2_with_one_line(case, message, small_tree, tmp_path):
    raw, out, extra = small_tree, tmp_path / "out", []
    if case == "missing-raw":
        raw = tmp_path / "nope"
    elif case == "no-images":
        raw = tmp_path / "empty"
        raw.mkdir()
        (raw / "readme.txt").write_text("x")
    elif case == "unknown-pipeline":
        extra = ["--pipeline", "sepia-9000"]
    elif case == "unknown-format":
        extra = ["--format", "parquet"]
    else:
        out.mkdir()
        (out / "precious.txt").write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-m", "cachekit.cli", "build", str(raw), "--out", str(out), *extra],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    if case == "non-empty-out":
        assert (out / "precious.txt").read_text() == "mine"


def test_info_on_a_non_cache_exits_2(tmp_path):
    code, out = run("info", tmp_path)
    assert code == 2 and "no manifest.json" in out


def _damage(case: str, cache):
    """Turn a copy of a good cache into the case's folder; returns the path to give to verify."""
    manifest = cache / "manifest.json"
    shards = [s["file"] for s in listed_manifest(cache)["shards"]]
    if case == "missing":
        return cache.parent / "nope"
    if case == "a-file":
        return manifest
    if case == "no-manifest":
        manifest.unlink()
    elif case == "someone-elses-manifest":
        manifest.write_text(json.dumps({"name": "my-web-app", "icons": []}))
    elif case == "manifest-not-json":
        manifest.write_text(manifest.read_text()[:-40])
    elif case == "manifest-invalid":
        obj = json.loads(manifest.read_text())
        obj["num_samples"] += 1
        manifest.write_text(json.dumps(obj))
    elif case == "other-format-version":
        obj = json.loads(manifest.read_text())
        obj["format_version"] = 1
        manifest.write_text(json.dumps(obj))
    elif case == "shard-flipped":
        data = bytearray((cache / shards[0]).read_bytes())
        data[len(data) // 2] ^= 0x01
        (cache / shards[0]).write_bytes(bytes(data))
    elif case == "shard-missing":
        (cache / shards[-1]).unlink()
    return cache


@pytest.mark.parametrize(
    "case, code, words",
    [
        ("good", 0, "ok:"),
        ("missing", 2, "no such cache folder"),
        ("a-file", 2, "not a folder"),
        ("no-manifest", 2, "no manifest.json"),
        ("someone-elses-manifest", 2, "not a cachekit manifest"),
        ("manifest-not-json", 1, "not valid JSON"),
        ("manifest-invalid", 1, "num_samples"),
        ("other-format-version", 1, "cache format mismatch"),
        ("shard-flipped", 1, "sha256 mismatch"),
        ("shard-missing", 1, "missing"),
    ],
)
def test_verify_exit_codes(case, code, words, small_cache, tmp_path):
    """0 ok; 1 a problem found in a cache (rebuild it); 2 not a cache at all (wrong path)."""
    shutil.copytree(small_cache, tmp_path / "c")
    target = _damage(case, tmp_path / "c")
    result = CliRunner().invoke(main, ["verify", str(target)])
    assert result.exit_code == code, result.output
    assert words in result.output and "Traceback" not in result.output
    if code == 2:  # the same for every command that takes a cache
        assert run("info", target)[0] == 2


def test_exit_codes_are_in_every_help():
    for command in ([], ["build"], ["verify"], ["bench"], ["info"], ["recipes"]):
        code, out = run(*command, "--help")
        assert code == 0 and "Exit codes:" in out and "not a cache" in out, command
    assert run("verify", "--nope")[0] == 2


def test_recipes_lists_every_builtin_with_its_description():
    code, out = run("recipes")
    assert code == 0
    folder = Path(__file__).resolve().parents[1] / "pipelines"
    tomls = sorted(folder.glob("*.toml"))
    assert len(tomls) >= 4
    lines = out.splitlines()
    for toml in tomls:
        recipe = tomllib.loads(toml.read_text())
        line = next(line for line in lines if line.split()[:1] == [toml.stem])
        assert recipe["description"] in line
    for op in OPS:
        assert any(line.strip().startswith(f"{op}(size") for line in lines), op
    assert "224x224" in out and "own size" in out


def test_build_help_names_every_builtin_recipe():
    code, out = run("build", "--help")
    flat = " ".join(out.split())
    for name in builtin_pipelines():
        assert name in flat, name


def test_recipes_name_prints_a_toml_that_builds_the_same_recipe(tmp_path):
    code, out = run("recipes", "letterbox-640")
    assert code == 0
    (tmp_path / "mine.toml").write_text(out)
    assert load_pipeline(str(tmp_path / "mine.toml")) == load_pipeline("letterbox-640")
    code, out = run("recipes", "sepia-9000")
    assert code == 2 and "unknown pipeline" in out


def test_readme_documents_every_builtin_recipe_and_op():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "BUILDING.md").read_text()
    for name in builtin_pipelines():
        assert f"| `{name}` |" in readme, name
    for op, definition in OPS.items():
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{op}` |")), None)
        assert row is not None, op
        for param in definition.params:
            assert f"`{param}`" in row, (op, param)


def _pixels_by_source(ds) -> dict[str, tuple[int, bytes]]:
    """Every sample of a dataset as source path -> (label, pixel bytes)."""
    images, labels = ds.read_batch(np.arange(len(ds)))[:2]
    return {ds.source(i): (int(labels[i]), images[i].numpy().tobytes()) for i in range(len(ds))}


def test_build_info_verify_on_s3_with_storage_options_only(s3_options, small_tree, small_cache, tmp_path):
    """No AWS_* variable, no ~/.aws: only --storage-option reaches the bucket, in the worker processes too."""
    s3fs = pytest.importorskip("s3fs")
    from cachekit import CachedDataset

    url = "s3://datasets/cli-options"
    flags = storage_option_args(s3_options)
    args = [
        "build",
        small_tree,
        "--out",
        url,
        "--size",
        32,
        "--shard-size",
        7,
        "--order",
        "sorted",
        "--quiet",
    ]
    endpoint_only = ["--storage-option", f"endpoint_url={s3_options['endpoint_url']}"]
    code, out = run(*args, "--workers", 2, *endpoint_only)
    assert code == 2 and "credentials" in out and "Traceback" not in out, out  # the environment has none
    code, out = run(*args, "--workers", 2, *flags)
    assert code == 0 and "40 samples, 0 skipped" in out and url in out, out
    code, out = run("info", url, *flags)
    assert code == 0 and "uint8 [3, 32, 32]" in out, out
    code, out = run("verify", url, *flags)
    assert code == 0 and out.startswith("ok: 6 shards, 40 samples"), out
    remote = CachedDataset(url, storage_options=s3_options, local_cache=tmp_path / "lc")
    assert _pixels_by_source(remote) == _pixels_by_source(CachedDataset(small_cache))
    fs = s3fs.S3FileSystem(**s3_options)
    assert fs.exists("datasets/cli-options/manifest.json")
    assert holds_secret(fs, "datasets/cli-options", S3_SECRET) == []


@pytest.mark.parametrize(
    "pairs, words",
    [
        ([f"secret:{S3_SECRET}"], "expected KEY=VALUE, got no '='"),
        ([S3_SECRET], "expected KEY=VALUE, got no '='"),
        ([f"={S3_SECRET}"], "no KEY before '='"),
        ([f"secret={S3_SECRET}", f"secret={S3_SECRET}x"], "secret is given twice"),
        (["client_kwargs=1", f"client_kwargs.secret={S3_SECRET}"], "both as a value and as a table"),
        (
            [f"s3_additional_kwargs={{{S3_SECRET}"],
            "not valid JSON",
        ),  # a secret itself is text, braces and all
        ([f"bad key={S3_SECRET}"], "must be a name"),
    ],
)
def test_a_malformed_storage_option_is_one_line_without_its_value(pairs, words, small_cache):
    flags = [arg for pair in pairs for arg in ("--storage-option", pair)]
    for command in (
        ["info", "s3://datasets/x"],
        ["verify", "s3://datasets/x"],
        ["build", small_cache, "--out", "s3://d/x"],
    ):
        code, out = run(*command, *flags)
        lines = [line for line in out.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and words in lines[0], out
        assert S3_SECRET not in out


def test_storage_options_for_local_paths_only_are_refused(small_cache, tmp_path):
    code, out = run("info", small_cache, "--storage-option", "anon=true")
    assert code == 2 and "applies to URLs" in out
    code, out = run(
        "convert", small_cache, "--to", "hdf5", "--out", tmp_path / "h", "--storage-option", "anon=true"
    )
    assert code == 2 and "applies to URLs" in out and not (tmp_path / "h").exists()


@pytest.mark.slow  # retries against a failing S3 server: ~16 s
def test_a_failing_build_to_s3_never_shows_the_secret(s3_options, mixed_tree, monkeypatch):
    """A --strict failure, and an upload error whose text carries the secret (as a filesystem's
    message might): the line says what failed, never the secret; nothing is left referenced."""
    s3fs = pytest.importorskip("s3fs")
    from cachekit.store.location import RemoteLocation

    flags = storage_option_args(s3_options)
    url = "s3://datasets/cli-failing"
    code, out = run("build", mixed_tree, "--out", url, "--size", 16, "--strict", "--quiet", *flags)
    assert code == 1 and "--strict" in out and S3_SECRET not in out and "Traceback" not in out, out

    def leaky_upload(self, name, write):  # runs in the forked workers as well
        raise OSError(f"upload refused for secret {self.storage_options['secret']} at {self.url}")

    monkeypatch.setattr(RemoteLocation, "commit", leaky_upload)
    code, out = run("build", mixed_tree, "--out", url + "2", "--size", 16, "--workers", 1, "--quiet", *flags)
    assert code == 1 and "upload refused for secret ***" in out and S3_SECRET not in out, out
    fs = s3fs.S3FileSystem(**s3_options)
    assert not fs.exists("datasets/cli-failing/manifest.json") and not fs.exists(
        "datasets/cli-failing2/manifest.json"
    )
    assert holds_secret(fs, "datasets", S3_SECRET) == []


def test_bench_and_doctor_read_an_s3_cache_and_record_no_secret(
    s3_options, small_tree, small_cache, tmp_path
):
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(**s3_options)
    fs.put(str(small_cache) + "/", "datasets/cli-bench", recursive=True)
    url, flags = "s3://datasets/cli-bench", storage_option_args(s3_options)
    report = tmp_path / "bench.json"
    argv = ["bench", str(small_tree), url, "--workers", "0", "--epochs", "1", "--samples", "16"]
    argv += [
        "--batch-size",
        "8",
        "--raw-backends",
        "opencv",
        "--warm-only",
        "--quiet",
        "--json",
        str(report),
        *flags,
    ]
    proc = subprocess.run([sys.executable, "-m", "cachekit.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert S3_SECRET not in report.read_text() + proc.stdout + proc.stderr
    result = json.loads(report.read_text())
    assert "secret=***" in result["command"] and [c["path"] for c in result["caches"]] == [url]
    assert {r["loader"] for r in result["rows"]} == {"raw-opencv", "cache-pt"}
    code, out = run("doctor", url, "--steps", 2, "--batch-size", 8, "--step-ms", 1, "--workers", 0, *flags)
    assert code == 0 and "throughput:" in out and "Traceback" not in out, out


def _recipe(tmp_path, size_expr: str) -> str:
    path = tmp_path / "r.toml"
    path.write_text(f'name = "r"\nsize = 32\n[[steps]]\nop = "resize_shorter"\nsize = "{size_expr}"\n')
    return str(path)


def _labels(tmp_path, kind: str) -> str:
    path = tmp_path / "labels.csv"
    if kind == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01" * 10)
    elif kind == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer for ever
    else:
        path.mkdir()
    return str(path)


@pytest.mark.parametrize(
    "case, words",
    [
        ("size", "--size must be from 1 to 8192 pixels, got 100000"),
        ("augment", "--augment must be from 0 to 1024 variants per input"),
        ("recipe-divides-by-zero", "must be positive, finite numbers"),
        ("recipe-huge", "must be a whole number from 1 to 8192"),
        ("labels-binary", "is not UTF-8 text"),
        ("labels-fifo", "is not a regular file"),
        ("labels-folder", "is a folder"),
        ("update-and-overwrite", "--update and --overwrite contradict each other"),
        ("job-too-big", "GiB of pixels in each worker's memory"),
    ],
)
def test_build_options_past_their_limits_are_one_line_exit_2_before_any_work(
    case, words, small_tree, tmp_path
):
    if case.startswith("recipe"):
        extra = ["--pipeline", _recipe(tmp_path, "size*1/0" if case.endswith("zero") else "size*1000000/1")]
    elif case.startswith("labels"):
        extra = ["--labels", _labels(tmp_path, case.split("-")[1])]
    else:
        extra = {
            "size": ["--size", "100000"],
            "augment": ["--augment", "100000"],
            "update-and-overwrite": ["--update", "--overwrite"],
            "job-too-big": ["--size", "4096", "--augment", "64", "--shard-size", "64"],
        }[case]
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(small_tree), "--out", str(out), "--quiet", *extra])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert result.output.count("\n") == 1 and words in result.output, result.output
    assert not (out / "manifest.json").exists() and not list(out.glob("shard-*"))


@pytest.mark.parametrize("endpoint", ["file:///etc", "http//no-scheme"])
def test_an_endpoint_that_is_not_http_is_exit_2(endpoint):
    code, out = run("info", "s3://bucket/cache", "--storage-option", f"endpoint_url={endpoint}")
    assert code == 2 and "endpoint_url must be an http:// or https:// URL" in out and out.count("\n") == 1
