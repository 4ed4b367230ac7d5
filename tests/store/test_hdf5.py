"""Hostile HDF5 shards: links, external storage and virtual datasets that would read other files."""

from __future__ import annotations

import json
import re
import shutil

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from manifests import listed_manifest

from cachekit import BuildConfig, CachedDataset, CacheError, build
from cachekit.cli import main
from cachekit.store.atomic import sha256_file
from cachekit.tools.verify import verify


@pytest.fixture(scope="module")
def hdf5_cache(small_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("h5") / "cache"
    build(small_tree, out, BuildConfig(format="hdf5", size=32, shard_size=7, workers=1, progress=False))
    return out


def _secret(folder, n):
    """Labels an attacker wants served: in a raw file and in another HDF5 file, outside the cache."""
    secret = np.full(n, 31337, dtype="<i8")
    (folder / "secret.bin").write_bytes(secret.tobytes())
    with h5py.File(folder / "outside.h5", "w") as f:
        f["labels"] = secret
    return folder / "secret.bin", folder / "outside.h5"


def _external_link(f, n, raw, other):
    f["labels"] = h5py.ExternalLink(str(other), "/labels")


def _link_to_missing_file(f, n, raw, other):
    f["labels"] = h5py.ExternalLink(str(other.parent / "nowhere.h5"), "/labels")


def _external_storage(f, n, raw, other):
    f.create_dataset("labels", shape=(n,), dtype="<i8", external=[(str(raw), 0, n * 8)])


def _virtual_dataset(f, n, raw, other):
    layout = h5py.VirtualLayout(shape=(n,), dtype="<i8")
    layout[:] = h5py.VirtualSource(str(other), "labels", shape=(n,))
    f.create_virtual_dataset("labels", layout)


def _soft_link_to_outside(f, n, raw, other):
    f["elsewhere"] = h5py.ExternalLink(str(other), "/labels")
    f["labels"] = h5py.SoftLink("/elsewhere")


def _agree(cache, manifest, *shards):
    """Make the manifest agree with rewritten shards' sizes and checksums, as an attacker would."""
    for i in shards:
        info = manifest["shards"][i]
        info["bytes"] = (cache / info["file"]).stat().st_size
        info["sha256"] = sha256_file(cache / info["file"])
    (cache / "manifest.json").write_text(json.dumps(manifest))


HOSTILE = {
    "external link": (_external_link, "external link"),
    "external link to a missing file": (_link_to_missing_file, "external link"),
    "external storage": (_external_storage, "external files"),
    "virtual dataset": (_virtual_dataset, "virtual dataset"),
    "soft link to outside": (_soft_link_to_outside, "external link|soft"),
}


@pytest.mark.parametrize("variant", list(HOSTILE))
def test_shards_that_read_other_files_are_refused(hdf5_cache, tmp_path, variant):
    make, reason = HOSTILE[variant]
    cache = tmp_path / "c"
    shutil.copytree(hdf5_cache, cache)
    manifest = listed_manifest(cache)
    info = manifest["shards"][0]
    raw, other = _secret(tmp_path, info["samples"])
    with h5py.File(cache / info["file"], "a") as f:
        del f["labels"]
        make(f, info["samples"], raw, other)
    _agree(cache, manifest, 0)

    ds = CachedDataset(cache)
    with pytest.raises(CacheError, match=f"{info['file']}: .*({reason})"):
        ds.read_batch(range(len(ds)))
    assert ds[info["samples"]][1] != 31337  # the other shards still read
    problems = {p.file: p.problem for p in verify(cache).problems}
    assert list(problems) == [info["file"]] and re.search(reason, problems[info["file"]])
    result = CliRunner().invoke(main, ["verify", str(cache), "--quick"])
    assert result.exit_code == 1 and info["file"] in result.output and "Traceback" not in result.output


def test_a_group_or_an_extra_soft_link_is_refused(hdf5_cache, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(hdf5_cache, cache)
    manifest = listed_manifest(cache)
    first, second = (s["file"] for s in manifest["shards"][:2])
    with h5py.File(cache / first, "a") as f:
        f.create_group("more")
    with h5py.File(cache / second, "a") as f:
        f["alias"] = h5py.SoftLink("/labels")
    _agree(cache, manifest, 0, 1)
    problems = {p.file: p.problem for p in verify(cache).problems}
    assert "group" in problems[first] and "soft" in problems[second]


def test_a_shard_that_is_not_a_regular_file_is_refused(hdf5_cache, tmp_path):
    import os

    cache = tmp_path / "c"
    shutil.copytree(hdf5_cache, cache)
    name = listed_manifest(cache)["shards"][0]["file"]
    (cache / name).unlink()
    os.mkfifo(cache / name)  # opening it would block until a writer came
    ds = CachedDataset(cache)  # shards are checked when first read, not all at open
    with pytest.raises(CacheError, match="not a regular file"):
        ds.read_batch(np.arange(len(ds)))
    problems = {p.file: p.problem for p in verify(cache).problems}
    assert "not a regular file" in problems[name]


def test_images_whose_chunks_run_past_the_end_of_the_file_are_a_cache_error(hdf5_cache, tmp_path):
    """Raw chunks evenly spaced, as cachekit writes them, but moved so the last runs past the end
    of the file (an index without checksums, HDF5's earliest layout, rewritten by hand): the
    memory map must never be made past the file's end, and verify must say so."""
    cache = tmp_path / "c"
    shutil.copytree(hdf5_cache, cache)
    manifest = listed_manifest(cache)
    info = manifest["shards"][0]
    path = cache / info["file"]
    with h5py.File(path, "r") as f:
        columns = {name: f[name][()] for name in f}
    with h5py.File(path, "w", libver="earliest") as f:
        for name, value in columns.items():
            chunks = (1, *value.shape[1:]) if name == "images" else None
            f.create_dataset(name, data=value, chunks=chunks)

    def chunk_offsets():
        with h5py.File(path, "r") as f:
            found = []
            f["images"].id.chunk_iter(lambda s: found.append(s.byte_offset))
            return found

    data, row = bytearray(path.read_bytes()), columns["images"][0].size
    offsets = chunk_offsets()
    delta = len(data) - offsets[-1] - row // 2  # the last sample's second half lies past the end
    for offset in offsets:  # each address is stored once, in the chunk B-tree
        at = data.find(offset.to_bytes(8, "little"))
        data[at : at + 8] = (offset + delta).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    assert chunk_offsets()[-1] + row > path.stat().st_size
    _agree(cache, manifest, 0)
    with pytest.raises(CacheError, match="past the end of the file"):
        CachedDataset(cache)[0]
    (problem,) = verify(cache).problems
    assert "past the end of the file" in problem.problem
