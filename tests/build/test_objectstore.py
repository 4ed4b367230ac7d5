"""Builds to object storage: storage options reach every worker process (local and dask) with no
credentials in the environment, and an object-store --out gets shards of about 32 MB by default."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from conftest import S3_SECRET, holds_secret

from cachekit import BuildConfig, build, read_manifest
from cachekit.build import cacherun as run
from cachekit.build import shardplan
from cachekit.constants import DEFAULT_REMOTE_SHARD_BYTES, DEFAULT_SHARD_BYTES, MIN_SHARD_SAMPLES
from cachekit.tools.verify import verify

s3fs = pytest.importorskip("s3fs")


def test_the_default_shard_of_an_object_store_is_about_32_mb():
    """An ImageNet-sized plan at 224x224: ~32 MB shards on object storage, ~128 MB on disk."""
    sample = 3 * 224 * 224
    remote = shardplan.default_shard_size(sample, 1_281_167, DEFAULT_REMOTE_SHARD_BYTES)
    local = shardplan.default_shard_size(sample, 1_281_167)
    assert remote == DEFAULT_REMOTE_SHARD_BYTES // sample == 222  # 33.4 MB of pixels a shard
    assert local == DEFAULT_SHARD_BYTES // sample == 891
    assert DEFAULT_REMOTE_SHARD_BYTES == 32 * 1024 * 1024


def _tiny_tree(root, n: int):
    """``n`` 8x8 JPEGs in two classes: cheap to build, many enough to cut by bytes."""
    rng = np.random.default_rng(3)
    for i in range(n):
        folder = root / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        (folder / f"{i:04d}.jpg").write_bytes(cv2.imencode(".jpg", image)[1].tobytes())
    return root


def test_a_url_out_cuts_shards_by_the_remote_byte_target(s3_options, tmp_path, monkeypatch):
    """The same tree gets the object-store target on s3:// and the local one on disk; an explicit
    --shard-size wins over both. The target is shrunk to 20 samples' bytes, so that 480 inputs of
    192 bytes show it (a real 32 MB shard would take 170,000 of them)."""
    raw = _tiny_tree(tmp_path / "raw", 480)
    sample = 3 * 8 * 8
    monkeypatch.setattr(run, "DEFAULT_REMOTE_SHARD_BYTES", 20 * sample)
    config = BuildConfig(size=8, workers=2, progress=False)
    remote = build(raw, "s3://datasets/by-bytes", config, storage_options=s3_options).manifest
    local = build(raw, tmp_path / "local", config).manifest
    assert remote.format_options["shard_size"] == 20 and len(remote.shards) == math.ceil(480 / 20)
    assert sum(s.samples for s in remote.shards) * sample / len(remote.shards) == pytest.approx(20 * sample)
    assert local.format_options["shard_size"] == max(MIN_SHARD_SAMPLES, math.ceil(480 / 16)) == 30
    explicit = build(
        raw,
        "s3://datasets/by-flag",
        BuildConfig(size=8, workers=2, shard_size=40, progress=False),
        storage_options=s3_options,
    ).manifest
    assert explicit.format_options["shard_size"] == 40 and len(explicit.shards) == 12
    assert read_manifest("s3://datasets/by-bytes", storage_options=s3_options) == remote


@pytest.mark.slow
def test_storage_options_reach_dask_workers(s3_options, small_tree, small_cache):
    """A dask LocalCluster started with no credentials in its environment writes every shard."""
    pytest.importorskip("dask.distributed")
    config = BuildConfig(size=32, shard_size=7, order="sorted", workers=2, executor="dask", progress=False)
    result = build(small_tree, "s3://datasets/dask-options", config, storage_options=s3_options)
    assert result.status == "built" and result.manifest.num_samples == 40
    assert verify("s3://datasets/dask-options", storage_options=s3_options).ok
    local = read_manifest(small_cache)
    assert [s.samples for s in result.manifest.shards] == [s.samples for s in local.shards]
    assert holds_secret(s3fs.S3FileSystem(**s3_options), "datasets/dask-options", S3_SECRET) == []


def test_storage_options_are_given_once_and_never_shown(s3_options, small_tree):
    from cachekit import UsageError

    config = BuildConfig(storage_options=s3_options)
    assert S3_SECRET not in repr(config)
    with pytest.raises(UsageError, match="given twice"):
        build(small_tree, "s3://datasets/twice", config, storage_options={"anon": True})
