"""Builds on a real dask.distributed LocalCluster: byte-identical to local, and surviving a lost worker."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cachekit import BuildConfig, build, read_manifest
from cachekit.tools.verify import verify

distributed = pytest.importorskip("dask.distributed")


def _files(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def _same_cache(a, b):
    assert _files(a) == _files(b)
    assert read_manifest(a).to_json() | {"created": ""} == read_manifest(b).to_json() | {"created": ""}


@pytest.fixture(scope="module")
def cluster():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield cluster, client


def test_dask_build_is_byte_identical_to_the_local_one(mixed_tree, tmp_path, cluster):
    config = dict(size=48, shard_size=3, progress=False)
    build(mixed_tree, tmp_path / "local", BuildConfig(workers=2, **config))
    remote = BuildConfig(
        executor="dask", executor_options={"scheduler": cluster[0].scheduler_address}, **config
    )
    result = build(mixed_tree, tmp_path / "dask", remote)
    assert result.built_shards == len(result.manifest.shards) > 1
    _same_cache(tmp_path / "local", tmp_path / "dask")


def test_own_local_cluster_when_no_scheduler_is_given(small_tree, small_cache, tmp_path):
    build(
        small_tree,
        tmp_path / "c",
        BuildConfig(size=32, shard_size=7, workers=2, executor="dask", progress=False),
    )
    _same_cache(small_cache, tmp_path / "c")


def test_a_worker_killed_mid_build_still_gives_a_valid_cache(big_tree, tmp_path, cluster):
    cluster, client = cluster
    config = dict(size=64, shard_size=2, progress=False)
    build(big_tree, tmp_path / "local", BuildConfig(workers=1, **config))
    out = tmp_path / "dask"
    remote = BuildConfig(executor="dask", executor_options={"scheduler": cluster.scheduler_address}, **config)
    outcome = {}

    def run():
        try:
            outcome["result"] = build(big_tree, out, remote)
        except BaseException as exc:  # reported by the assertions below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("shard-*")):
        time.sleep(0.01)
    victim = next(iter(client.run(os.getpid).values()))
    os.kill(victim, signal.SIGKILL)  # the nanny restarts it; dask re-runs its lost task elsewhere
    thread.join(timeout=300)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == "built"
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
    assert verify(out).ok
    _same_cache(tmp_path / "local", out)


def test_unreachable_scheduler_is_one_clear_error(small_tree, tmp_path):
    from cachekit import UsageError

    bad = BuildConfig(
        size=32, executor="dask", executor_options={"scheduler": "tcp://127.0.0.1:9"}, progress=False
    )
    with pytest.raises(UsageError, match="cannot reach the dask scheduler"):
        build(small_tree, tmp_path / "c", bad)
