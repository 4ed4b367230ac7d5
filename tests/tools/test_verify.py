"""``cachekit verify``: bit flips, truncations, missing and swapped shards are named; good caches pass."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from manifests import listed_manifest

from cachekit.cli import main
from cachekit.tools.verify import verify


@pytest.fixture
def cache_copy(request, small_cache, mixed_tree, tmp_path):
    fmt = getattr(request, "param", "pt")
    if fmt == "pt":
        shutil.copytree(small_cache, tmp_path / "c")
    else:
        from cachekit import BuildConfig, build

        build(
            mixed_tree,
            tmp_path / "c",
            BuildConfig(format=fmt, size=32, shard_size=3, workers=1, progress=False),
        )
    return tmp_path / "c"


def _shards(cache):
    return [s["file"] for s in listed_manifest(cache)["shards"]]


def _cli(*args):
    result = CliRunner().invoke(main, ["verify", *map(str, args)])
    return result.exit_code, result.output


@pytest.mark.parametrize("cache_copy", ["pt", "hdf5"], indirect=True)
def test_a_good_cache_verifies(cache_copy):
    report = verify(cache_copy)
    assert report.ok and report.checked_bytes == report.manifest.total_bytes
    code, out = _cli(cache_copy)
    assert code == 0 and out.startswith("ok:") and f"{len(_shards(cache_copy))} shards" in out
    assert _cli(cache_copy, "--quick")[0] == 0


@pytest.mark.parametrize("cache_copy", ["pt", "hdf5"], indirect=True)
def test_bit_flips_and_truncations_are_named(cache_copy):
    names = _shards(cache_copy)
    flipped, cut = cache_copy / names[0], cache_copy / names[1]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:-100])
    code, out = _cli(cache_copy)
    assert code == 1
    lines = out.strip().splitlines()
    assert any(names[0] in line and "sha256 mismatch" in line for line in lines)
    assert any(names[1] in line and "truncated" in line for line in lines)
    assert "2 of" in lines[-1] and all(n not in out for n in names[2:])
    # --quick reads sizes and headers only: the size change is caught, the same-size bit flip is not
    code, out = _cli(cache_copy, "--quick")
    assert code == 1 and names[1] in out and names[0] not in out


def test_missing_and_swapped_shards(cache_copy):
    names = _shards(cache_copy)
    (cache_copy / names[0]).unlink()
    # same size, valid file, wrong contents: only the checksum can tell
    shutil.copy(cache_copy / names[2], cache_copy / names[1])
    report = verify(cache_copy)
    problems = {p.file: p.problem for p in report.problems}
    assert problems[names[0]] == "missing"
    assert names[1] in problems and "sha256" in problems[names[1]]


def test_a_header_that_does_not_match_the_manifest(cache_copy):
    import torch

    from cachekit.store.atomic import sha256_file
    from cachekit.store.formats import identity_column

    manifest = listed_manifest(cache_copy)
    info = manifest["shards"][0]
    torch.save(
        {
            "images": torch.zeros(3, 3, 32, 32, dtype=torch.uint8),
            "labels": torch.zeros(3, dtype=torch.int64),
            "shard_name": torch.from_numpy(identity_column(info["file"])),
        },
        cache_copy / info["file"],
    )
    info["bytes"] = (cache_copy / info["file"]).stat().st_size
    info["sha256"] = sha256_file(cache_copy / info["file"])
    (cache_copy / "manifest.json").write_text(json.dumps(manifest))
    code, out = _cli(cache_copy, "--quick")
    assert code == 1 and info["file"] in out and "manifest says" in out


def test_verify_on_a_non_cache_exits_2_with_one_line(tmp_path):
    code, out = _cli(tmp_path)
    assert code == 2 and out.strip().count("\n") == 0 and "no manifest.json" in out


def test_a_damaged_zarr_shard_folder_is_named(mixed_tree, tmp_path):
    from cachekit import BuildConfig, build

    build(
        mixed_tree,
        tmp_path / "z",
        BuildConfig(format="zarr", size=32, shard_size=3, workers=1, progress=False),
    )
    names = _shards(tmp_path / "z")
    inner = tmp_path / "z" / names[0] / "images" / "c" / "0" / "0" / "0" / "0"
    data = bytearray(inner.read_bytes())
    data[10] ^= 0xFF
    inner.write_bytes(bytes(data))
    (tmp_path / "z" / names[1] / "labels" / "zarr.json").unlink()
    outside = tmp_path / "elsewhere"
    outside.write_bytes(b"x")
    (tmp_path / "z" / names[2] / "sneaky").symlink_to(outside)
    problems = {p.file: p.problem for p in verify(tmp_path / "z").problems}
    assert "sha256" in problems[names[0]]
    assert names[1] in problems and "symlink" in problems[names[2]]
    assert set(problems) == set(names[:3])
