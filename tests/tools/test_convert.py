"""convert resumes after a kill or cleans up after it, shows progress, keeps sources, retires what it replaces."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import S3_SECRET, holds_secret, storage_option_args

from cachekit import CachedDataset, CacheError, UsageError, read_manifest
from cachekit.cli import main
from cachekit.tools import convert as convert_module
from cachekit.tools.convert import convert
from cachekit.tools.verify import verify


def _kill_after(monkeypatch, shards: int, midway: bool = False):
    """A convert killed after ``shards`` shards (``midway``: in the middle of writing the next one)."""
    real, seen = convert_module.commit_shard, []

    def killed(url, name, fmt_name, arrays, options, storage_options=None):
        if len(seen) == shards:
            if midway:
                from cachekit.store.formats import get_format

                def half(tmp):
                    get_format(fmt_name).write(tmp, arrays, options)
                    raise KeyboardInterrupt

                from cachekit.store.location import open_location

                open_location(url, storage_options).commit(name, half)
            raise KeyboardInterrupt
        seen.append(name)
        return real(url, name, fmt_name, arrays, options, storage_options)

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
    assert {p.name for p in (tmp_path / "h").iterdir()} == {
        "manifest.json",
        a.index["file"],
        *(s.file for s in a.shards),
    }
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
    assert {p.name for p in (tmp_path / "z").iterdir()} == {
        "manifest.json",
        m.index["file"],
        *(s.file for s in m.shards),
    }
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


def _samples(ds) -> list[tuple[int, bytes]]:
    images, labels = ds.read_batch(np.arange(len(ds)))[:2]
    return [(int(labels[i]), images[i].numpy().tobytes()) for i in range(len(ds))]


@pytest.mark.slow  # an S3 server round trip both ways: ~18 s
def test_convert_from_and_to_s3_with_storage_options(s3_options, small_cache, tmp_path):
    """URL to URL on the command line, URL to a folder in Python: the same samples, checked source shards."""
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(**s3_options)
    fs.put(str(small_cache) + "/", "datasets/conv-src", recursive=True)
    flags = storage_option_args(s3_options)
    argv = ["convert", "s3://datasets/conv-src", "--to", "hdf5", "--out", "s3://datasets/conv-h5", "--quiet"]
    result = CliRunner().invoke(main, [*argv, *flags])
    assert result.exit_code == 0 and "40 samples, 6 hdf5 shards" in result.output, result.output
    expected = _samples(CachedDataset(small_cache))
    h5 = CachedDataset("s3://datasets/conv-h5", storage_options=s3_options, local_cache=tmp_path / "lc")
    assert h5.manifest.format == "hdf5" and _samples(h5) == expected
    assert verify("s3://datasets/conv-h5", storage_options=s3_options).ok
    assert CliRunner().invoke(main, [*argv, *flags]).exit_code == 0  # a re-run: already converted
    convert("s3://datasets/conv-h5", tmp_path / "zarr", "zarr", storage_options=s3_options)
    assert _samples(CachedDataset(tmp_path / "zarr")) == expected
    assert holds_secret(fs, "datasets", S3_SECRET) == []


def test_a_changed_source_shard_on_s3_is_refused(s3_options, small_cache, tmp_path):
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(**s3_options)
    fs.put(str(small_cache) + "/", "datasets/conv-bad", recursive=True)
    victim = read_manifest(small_cache).shards[1].file
    data = bytearray(fs.cat_file(f"datasets/conv-bad/{victim}"))
    data[len(data) // 2] ^= 0x01  # one flipped bit, same size
    fs.pipe_file(f"datasets/conv-bad/{victim}", bytes(data))
    argv = ["convert", "s3://datasets/conv-bad", "--to", "pt", "--out", str(tmp_path / "out"), "--quiet"]
    result = CliRunner().invoke(main, [*argv, *storage_option_args(s3_options)])
    assert result.exit_code == 1 and victim in result.output and "sha256" in result.output, result.output
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_flipped_bit_in_a_local_source_shard_is_refused(small_cache, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(small_cache, src)
    shard = src / read_manifest(src).shards[1].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one pixel bit, somewhere in the middle
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheError, match="do not match the manifest"):
        convert(src, tmp_path / "out", "hdf5")


def test_records_left_by_a_kill_after_a_finished_conversion_are_removed_by_the_next(small_cache, tmp_path):
    out = tmp_path / "z"
    m = convert(small_cache, out, "zarr", progress=False)
    partial = out / ".cachekit-partial"
    partial.mkdir()  # the plan gone, a sidecar left: killed while the records were removed
    orphan = "shard-00112233445566778899.zarr"
    (out / orphan).mkdir()
    for name in (m.shards[0].file, orphan):
        (partial / f"{name}.json").write_text("{}")
    assert convert(small_cache, out, "zarr", progress=False) == m  # already converted: clean up only
    assert {p.name for p in out.iterdir()} == {"manifest.json", m.index["file"], *(s.file for s in m.shards)}
    assert verify(out).ok
