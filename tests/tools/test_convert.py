"""convert resumes after a kill or cleans up after it, shows progress, keeps sources, retires what it replaces."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cachekit import CachedDataset, UsageError, read_manifest
from cachekit.cli import main
from cachekit.tools import convert as convert_module
from cachekit.tools.convert import convert
from cachekit.tools.verify import verify


def _kill_after(monkeypatch, shards: int, midway: bool = False):
    """A convert killed after ``shards`` shards (``midway``: in the middle of writing the next one)."""
    real, seen = convert_module.commit_shard, []

    def killed(url, name, fmt_name, arrays, options):
        if len(seen) == shards:
            if midway:
                from cachekit.store.formats import get_format

                def half(tmp):
                    get_format(fmt_name).write(tmp, arrays, options)
                    raise KeyboardInterrupt

                from cachekit.store.location import open_location

                open_location(url).commit(name, half)
            raise KeyboardInterrupt
        seen.append(name)
        return real(url, name, fmt_name, arrays, options)

    monkeypatch.setattr(convert_module, "commit_shard", killed)
    return seen


def test_a_killed_convert_resumes_to_the_same_cache(small_cache, tmp_path, monkeypatch):
    convert(small_cache, tmp_path / "whole", "hdf5", compression="gzip")
    with monkeypatch.context() as patch:
        done = _kill_after(patch, 3, midway=True)
        with pytest.raises(KeyboardInterrupt):
            convert(small_cache, tmp_path / "h", "hdf5", compression="gzip")
    assert not [p for p in (tmp_path / "h").iterdir() if p.name.endswith(".tmp")]
    assert not (tmp_path / "h" / "manifest.json").exists()
    times = {name: (tmp_path / "h" / name).stat().st_mtime_ns for name in done}
    result = CliRunner().invoke(
        main,
        [
            "convert",
            str(small_cache),
            "--to",
            "hdf5",
            "--compression",
            "gzip",
            "--out",
            str(tmp_path / "h"),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert all((tmp_path / "h" / name).stat().st_mtime_ns == t for name, t in times.items())  # reused
    a, b = read_manifest(tmp_path / "h"), read_manifest(tmp_path / "whole")
    assert a.to_json() | {"created": ""} == b.to_json() | {"created": ""}
    assert {p.name for p in (tmp_path / "h").iterdir()} == {"manifest.json", *(s.file for s in a.shards)}
    ds = CachedDataset(tmp_path / "h")
    assert [ds.source(i) for i in range(len(ds))] == [
        CachedDataset(small_cache).source(i) for i in range(len(ds))
    ]


def test_a_killed_convert_of_other_options_is_cleaned_up(small_cache, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        _kill_after(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            convert(small_cache, tmp_path / "z", "zarr", compression="zstd")
    convert(small_cache, tmp_path / "z", "zarr", compression="lz4", overwrite=True)
    m = read_manifest(tmp_path / "z")
    assert {p.name for p in (tmp_path / "z").iterdir()} == {"manifest.json", *(s.file for s in m.shards)}
    assert verify(tmp_path / "z").ok


def test_convert_over_a_cache_retires_its_shards_and_shows_progress(small_cache, tmp_path):
    first = convert(small_cache, tmp_path / "c", "hdf5")
    result = CliRunner().invoke(
        main, ["convert", str(small_cache), "--to", "zarr", "--out", str(tmp_path / "c"), "--overwrite"]
    )
    assert result.exit_code == 0 and "convert" in result.stderr and "40/40" in result.stderr
    assert all((tmp_path / "c" / s.file).exists() for s in first.shards)  # for readers of the old version
    convert(small_cache, tmp_path / "c", "zarr", grace=0)  # already converted: cleans up only
    assert not any((tmp_path / "c" / s.file).exists() for s in first.shards)


@pytest.mark.parametrize("where", ["inside", "holding"])
def test_convert_refuses_an_out_inside_or_around_the_cache(small_cache, tmp_path, where):
    out = small_cache / "converted" if where == "inside" else small_cache.parent
    with pytest.raises(UsageError, match="inside"):
        convert(small_cache, out, "hdf5")
