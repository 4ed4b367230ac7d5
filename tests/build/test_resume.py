"""Crash safety: SIGKILLed builds resume to a byte-identical cache; updates, locks and write errors."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, CachedDataset, build, read_manifest
from cachekit.cli import main
from cachekit.constants import PARTIAL_DIR
from cachekit.tools.verify import verify

BUILD_ARGS = ["--shard-size", "2", "--workers", "2", "--size", "64", "--quiet"]


def _cmd(raw: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "cachekit.cli", "build", str(raw), "--out", str(out), *BUILD_ARGS]


def _finished_shards(out: Path) -> int:
    partial = out / PARTIAL_DIR
    return len([p for p in partial.glob("shard-*.json")]) if partial.is_dir() else 0


def _contents(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def _manifest_without_time(out: Path) -> dict:
    return read_manifest(out).to_json() | {"created": ""}


@pytest.fixture(scope="module")
def clean_build(big_tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clean") / "cache"
    subprocess.run(_cmd(big_tree, out), check=True, capture_output=True)
    return out


@pytest.mark.parametrize("kill_after", [0, 3, 30], ids=lambda k: f"after-{k}-shards")
def test_sigkilled_build_resumes_to_a_byte_identical_cache(big_tree, clean_build, tmp_path, kill_after):
    out = tmp_path / "cache"
    proc = subprocess.Popen(_cmd(big_tree, out), start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / PARTIAL_DIR / "state.json").exists() and _finished_shards(out) >= kill_after:
            break
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)  # the build and its worker processes, as a crash would
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert not (out / "manifest.json").exists()
    finished = _finished_shards(out)

    again = subprocess.run(_cmd(big_tree, out), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    if finished:
        assert again.stdout.startswith("resumed:") and f"({finished} reused)" in again.stdout
    assert _contents(out) == _contents(clean_build)  # no temp files, locks or records left behind
    assert _manifest_without_time(out) == _manifest_without_time(clean_build)
    assert verify(out).ok


def test_a_partial_build_of_other_options_needs_overwrite(big_tree, tmp_path):
    out = tmp_path / "cache"
    proc = subprocess.Popen(_cmd(big_tree, out), start_new_session=True, stderr=subprocess.PIPE)
    while proc.poll() is None and not (out / PARTIAL_DIR / "state.json").exists():
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    other = [a if a != "64" else "48" for a in _cmd(big_tree, out)]
    result = subprocess.run(other, capture_output=True, text=True)
    assert result.returncode == 2 and "unfinished build of other options" in result.stderr
    assert "--overwrite" in result.stderr


def test_rerun_of_a_finished_build_is_up_to_date(small_tree, tmp_path):
    args = ["build", str(small_tree), "--out", str(tmp_path / "c"), "--size", "32", "--quiet"]
    assert CliRunner().invoke(main, args).exit_code == 0
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and result.output.startswith("up to date")


def test_update_rebuilds_only_what_changed(small_tree, tmp_path):
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(small_tree, raw)
    out = tmp_path / "c"
    config = BuildConfig(size=32, shard_size=4, workers=1, progress=False)
    first = build(raw, out, config)
    before = {s.file: (out / s.file).stat().st_mtime_ns for s in first.manifest.shards}

    (raw / "class_000" / "img_0000000.jpg").unlink()  # removed
    extra = raw / "class_003" / "img_0000039.jpg"
    shutil.copy(extra, raw / "class_003" / "img_0000039b.jpg")  # added
    changed = raw / "class_001" / "img_0000021.jpg"
    img = cv2.imread(str(changed))
    cv2.imwrite(str(changed), 255 - img)  # changed content, size and mtime

    result = build(raw, out, BuildConfig(size=32, shard_size=4, workers=1, progress=False, update=True))
    assert result.status == "updated"
    assert 0 < result.built_shards <= 4 and result.reused_shards >= len(first.manifest.shards) - 4
    m = result.manifest
    kept = [s.file for s in m.shards if s.file in before]
    assert len(kept) == result.reused_shards
    assert all((out / f).stat().st_mtime_ns == before[f] for f in kept)  # untouched shards not rewritten
    dropped = set(before) - {s.file for s in m.shards}
    assert (
        result.retired - 1 == len(dropped) == result.built_shards
    )  # kept for readers of the old version (and its index)
    assert sorted(p.name for p in out.glob("shard-*")) == sorted({*dropped, *(s.file for s in m.shards)})

    # byte for byte what a fresh build with the final options (its recorded shard count) writes
    fresh = build(
        raw,
        tmp_path / "fresh",
        BuildConfig(size=32, shard_size=4, shards=m.order["shards"], workers=1, progress=False),
    )
    assert fresh.manifest.to_json() | {"created": ""} == m.to_json() | {"created": ""}
    for s in m.shards:
        assert (out / s.file).read_bytes() == (tmp_path / "fresh" / s.file).read_bytes()
    assert len(CachedDataset(out)) == 40


def test_disk_full_keeps_the_previous_cache_intact(small_tree, tmp_path, monkeypatch):
    out = tmp_path / "c"
    build(small_tree, out, BuildConfig(size=32, shard_size=8, workers=1, progress=False))
    before = _contents(out) | {"manifest.json": (out / "manifest.json").read_bytes()}

    from cachekit.store.formats.pt import PtFormat

    real_write, calls = PtFormat.write, []

    def write_until_full(self, path, arrays, options):
        calls.append(path)
        if len(calls) == 3:
            with open(path, "wb") as fh:
                fh.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, path, arrays, options)

    monkeypatch.setattr(PtFormat, "write", write_until_full)
    args = [
        "build",
        str(small_tree),
        "--out",
        str(out),
        "--size",
        "40",
        "--overwrite",
        "--workers",
        "1",
        "--quiet",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "disk full" in lines[0]
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name in before}
    assert after == before  # the old manifest and every shard it references are untouched
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
    assert verify(out).ok and len(CachedDataset(out)) == 40


def test_an_unwritable_out_is_one_line_exit_1(small_tree, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachekit.cli",
            "build",
            str(small_tree),
            "--out",
            str(blocker / "c"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot create" in result.stderr


def test_an_input_that_could_not_be_read_is_retried_by_the_next_build(small_tree, tmp_path, monkeypatch):
    from cachekit.build.sources import reading

    victim = "class_002/img_0000022.jpg"
    real = reading.read_input

    def flaky_disk(path, max_bytes=0):
        if str(path).endswith(victim):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(path, max_bytes)

    out = tmp_path / "c"
    config = BuildConfig(size=16, shard_size=5, workers=1, progress=False)
    with monkeypatch.context() as patch:
        patch.setattr(reading, "read_input", flaky_disk)
        patch.setattr(reading, "_READ_TRIES", (0.0, 0.0, 0.0))
        first = build(small_tree, out, config)
    [skip] = first.manifest.skipped
    assert skip.path == victim and skip.retry and "unreadable: Input/output error" in skip.reason
    again = build(small_tree, out, config)  # the disk is fine again: not "up to date"
    assert again.status == "updated" and again.built_shards == 1 and not again.manifest.skipped
    assert again.manifest.num_samples == 40 and build(small_tree, out, config).status == "up to date"


def test_update_goes_on_with_an_unfinished_build_whose_inputs_changed(small_tree, tmp_path, monkeypatch):
    import shutil

    from cachekit.build import cacherun as run

    raw, out = tmp_path / "raw", tmp_path / "c"
    shutil.copytree(small_tree, raw)
    config = dict(size=16, shard_size=5, workers=1, progress=False)
    real, seen = run.write_sidecar, []

    def killed(location, result):
        real(location, result)
        seen.append(result.info.file)
        if len(seen) == 4:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(run, "write_sidecar", killed)
        with pytest.raises(KeyboardInterrupt):
            build(raw, out, BuildConfig(**config))
    shutil.copy(raw / "class_001" / "img_0000001.jpg", raw / "class_001" / "new.jpg")  # one bucket changes
    with pytest.raises(Exception, match="unfinished build of other options or inputs.*--update"):
        build(raw, out, BuildConfig(**config))
    result = build(raw, out, BuildConfig(**config, update=True))
    # every finished shard the changed file did not touch is kept (content names: same inputs, same file)
    assert result.status == "resumed" and result.reused_shards >= 3
    assert result.reused_shards == len(set(seen) & {s.file for s in result.manifest.shards})
    fresh = build(raw, tmp_path / "fresh", BuildConfig(**config, shards=result.manifest.order["shards"]))
    assert fresh.manifest.to_json() | {"created": ""} == result.manifest.to_json() | {"created": ""}
    m = result.manifest
    assert {p.name for p in out.iterdir()} == {"manifest.json", m.index["file"], *(s.file for s in m.shards)}
