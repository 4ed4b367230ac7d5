"""Caches on S3: a real S3-compatible server (moto's, on loopback), read through fsspec/s3fs."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

from cachekit import CachedDataset, CacheError, UsageError, make_loader, read_manifest
from cachekit.store.atomic import path_size

s3fs = pytest.importorskip("s3fs")


@pytest.fixture(scope="module")
def s3(s3_endpoint, small_cache):
    """The loopback S3 server holding ``small_cache`` at s3://datasets/small; yields its filesystem."""
    fs = s3fs.S3FileSystem(anon=False)
    fs.put(str(small_cache) + "/", "datasets/small", recursive=True)
    return fs


def test_shuffled_read_of_an_s3_cache_matches_the_local_one(s3, small_cache, tmp_path):
    remote = CachedDataset("s3://datasets/small", local_cache=tmp_path / "lc")
    local = CachedDataset(small_cache)
    assert len(remote) == len(local) and remote.classes == local.classes
    assert remote.manifest == read_manifest(small_cache)
    loader = make_loader(remote, batch_size=8, seed=4)
    seen = {}
    reference = local.read_batch(np.arange(len(local)))[0]
    for images, labels in loader:
        for image, label in zip(images, labels.tolist()):
            match = [i for i in range(len(local)) if torch.equal(reference[i], image)]
            assert len(match) == 1 and local[match[0]][1] == label
            seen[match[0]] = True
    assert sorted(seen) == list(range(len(local)))
    fetched = list((tmp_path / "lc").rglob("shard-*"))
    assert len(fetched) == remote.num_shards  # each shard fetched once into the local cache


def test_the_local_cache_is_bounded_lru(s3, small_cache, tmp_path):
    shard_bytes = max(s.bytes for s in read_manifest(small_cache).shards)
    bound = 2 * shard_bytes + 1
    ds = CachedDataset("s3://datasets/small", local_cache=tmp_path / "lc", local_cache_bytes=bound)
    for i in range(0, len(ds), 7):  # touch every shard in turn
        ds[i]
    kept = list((tmp_path / "lc").rglob("shard-*"))
    assert sum(path_size(p) for p in kept) <= bound and len(kept) == 2
    assert torch.equal(ds[0][0], CachedDataset(small_cache)[0][0])  # evicted, fetched again


def test_a_tampered_remote_shard_is_refused(s3, small_cache, tmp_path):
    s3.put(str(small_cache) + "/", "datasets/tampered", recursive=True)
    victim = read_manifest(small_cache).shards[0].file
    data = bytearray(s3.cat_file(f"datasets/tampered/{victim}"))
    data[len(data) // 2] ^= 0xFF
    s3.pipe_file(f"datasets/tampered/{victim}", bytes(data))
    ds = CachedDataset("s3://datasets/tampered", local_cache=tmp_path / "lc")
    with pytest.raises(CacheError, match="sha256"):
        ds[0]
    assert not list((tmp_path / "lc").rglob("shard-*"))


def test_missing_remote_cache_is_a_cache_error(s3):
    with pytest.raises(CacheError, match="no manifest.json"):
        CachedDataset("s3://datasets/nothing-here")


def test_build_from_s3_raw_into_an_s3_cache(s3, small_tree, small_cache, tmp_path):
    from cachekit import BuildConfig, build

    s3.put(str(small_tree) + "/", "datasets/raw", recursive=True)
    config = BuildConfig(size=32, shard_size=7, order="sorted", workers=2, progress=False)
    result = build("s3://datasets/raw", "s3://datasets/built", config)
    assert result.status == "built" and result.path == "s3://datasets/built"
    local = read_manifest(small_cache)
    m = result.manifest
    assert m.classes == local.classes and m.num_samples == local.num_samples
    # the same shards as the local build; names differ (they hash the inputs' mtimes), and so do
    # the bytes, as each shard records its own name
    assert [(s.samples, s.pixel_sum) for s in m.shards] == [(s.samples, s.pixel_sum) for s in local.shards]
    assert sorted(s3.ls("datasets/built", detail=False)) == sorted(
        f"datasets/built/{name}" for name in ["manifest.json", m.index["file"], *(s.file for s in m.shards)]
    )
    remote = CachedDataset("s3://datasets/built", local_cache=tmp_path / "lc")
    assert torch.equal(remote.read_batch(range(40))[0], CachedDataset(small_cache).read_batch(range(40))[0])
    from click.testing import CliRunner

    from cachekit.cli import main

    info = CliRunner().invoke(main, ["info", "s3://datasets/built"])
    assert info.exit_code == 0 and "40 (0 inputs skipped)" in info.output.replace("samples:   ", "")
    again = build("s3://datasets/raw", "s3://datasets/built", config)
    assert again.status == "up to date"
    with pytest.raises(
        UsageError, match=r"other options \(size 32 -> 48, order sorted -> shuffled\).*--overwrite"
    ):
        build("s3://datasets/raw", "s3://datasets/built", BuildConfig(size=48, progress=False))


def test_a_remote_build_resumes_from_recorded_checksums(s3, small_tree, monkeypatch, tmp_path):
    """Finished shards of an interrupted build to S3 are kept on their size and recorded sha256,
    without downloading them again."""
    from cachekit import BuildConfig, build
    from cachekit.build import cacherun as run
    from cachekit.store.location import RemoteLocation

    s3.put(str(small_tree) + "/", "datasets/raw2", recursive=True)
    config = BuildConfig(size=16, shard_size=5, workers=1, progress=False)
    real, seen = run.write_sidecar, []

    def killed(out, result):
        real(out, result)
        seen.append(result)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(run, "write_sidecar", killed)
        with pytest.raises(KeyboardInterrupt):
            build("s3://datasets/raw2", "s3://datasets/resumed", config)

    def no_download(self, name):
        raise AssertionError(f"{name} was downloaded to be hashed")

    monkeypatch.setattr(RemoteLocation, "sha256", no_download)
    result = build("s3://datasets/raw2", "s3://datasets/resumed", config)
    assert result.status == "resumed" and result.reused_shards == 3
    assert len(CachedDataset("s3://datasets/resumed", local_cache=tmp_path / "lc")) == 40


@pytest.fixture
def silent_endpoint():
    """An endpoint that accepts connections and never answers (a firewall that drops, a hung proxy)."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        yield [
            "--storage-option",
            f"endpoint_url={endpoint}",
            "--storage-option",
            "key=k",
            "--storage-option",
            "secret=s",
        ]


def _cachekit(args, env: dict) -> subprocess.CompletedProcess:
    import os
    import sys

    cmd = [sys.executable, "-c", "from cachekit.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("command", [["verify", "s3://datasets/small"], ["info", "s3://datasets/small"]])
def test_storage_that_never_answers_is_one_line_within_the_reply_deadline(silent_endpoint, command):
    options = silent_endpoint + [
        "--storage-option",
        "config_kwargs.retries.max_attempts=20",
    ]  # minutes of retries
    done = _cachekit([*command, *options], {"CACHEKIT_REMOTE_TIMEOUT": "2"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "no answer from the storage within 2 s" in done.stderr


def test_a_build_into_storage_that_never_answers_is_one_line(silent_endpoint, small_tree, tmp_path):
    args = ["build", str(small_tree), "--out", "s3://datasets/never", "--quiet"]
    done = _cachekit([*args, *silent_endpoint], {"CACHEKIT_REMOTE_TIMEOUT": "2"})
    assert done.returncode == 2 and "no answer from the storage" in done.stderr, done.stderr


def test_the_whole_command_has_a_deadline(silent_endpoint):
    args = ["verify", "s3://datasets/small", *silent_endpoint]
    done = _cachekit([*args, "--timeout", "2s"], {"CACHEKIT_REMOTE_TIMEOUT": "0"})  # no first-reply deadline
    assert done.returncode == 1 and done.stderr == "error: not done within --timeout 2 s; gave up\n"
    done = _cachekit(args, {"CACHEKIT_REMOTE_TIMEOUT": "0", "CACHEKIT_TIMEOUT": "1"})
    assert done.returncode == 1 and "--timeout 1 s" in done.stderr
    done = _cachekit([*args, "--timeout", "soon"], {})
    assert done.returncode == 2 and "--timeout: expected seconds" in done.stderr


@pytest.mark.parametrize("name", ["../../outside", "a/../../../outside", "/etc/x", "", "a//b"])
def test_a_folder_shard_object_named_out_of_the_shard_is_refused_before_a_byte_lands(tmp_path, name):
    from cachekit.store.remote import fetch_shard

    class Listing:  # what a hostile or broken store could list for a folder shard
        def cat_file(self, path, start=None, end=None):
            raise AssertionError("nothing may be fetched")

    target = tmp_path / "copies" / "shard.zarr"
    target.parent.mkdir()
    objects = [("bucket/c/shard.zarr/zarr.json", 2), (f"bucket/c/shard.zarr/{name}", 3)]
    with pytest.raises(CacheError, match="not a plain path inside the shard"):
        fetch_shard(Listing(), "bucket/c/shard.zarr", target, objects)
    assert not (tmp_path / "outside").exists() and not target.exists()
