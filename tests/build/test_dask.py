"""Builds on a real dask.distributed LocalCluster: byte-identical to local, and surviving a lost worker."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cachekit import BuildConfig, BuildError, build, read_manifest
from cachekit.tools.verify import verify

distributed = pytest.importorskip("dask.distributed")
run_module = importlib.import_module("cachekit.build.cacherun")


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


def _build_or_error(raw, out, config: BuildConfig, limit: float, hang: str):
    """``build``'s result or the exception it raised; in a daemon thread joined for at most ``limit``
    seconds, so a build that never ends fails the test (saying ``hang``) instead of hanging pytest."""
    outcome = {}

    def run():
        try:
            outcome["result"] = build(raw, out, config)
        except BaseException as exc:  # handed to the test
            outcome["result"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=limit)
    assert not thread.is_alive(), f"the build {hang}"
    return outcome["result"]


def _on(scheduler: str, **config) -> BuildConfig:
    """A build on the dask cluster at ``scheduler``, without a progress bar unless asked."""
    return BuildConfig(
        executor="dask", executor_options={"scheduler": scheduler}, **{"progress": False, **config}
    )


def test_dask_build_is_byte_identical_to_the_local_one(mixed_tree, tmp_path, cluster):
    config = dict(size=48, shard_size=3, progress=False)
    build(mixed_tree, tmp_path / "local", BuildConfig(workers=2, **config))
    remote = _on(cluster[0].scheduler_address, **config)
    result = build(mixed_tree, tmp_path / "dask", remote)
    assert result.built_shards == len(result.manifest.shards) > 1
    _same_cache(tmp_path / "local", tmp_path / "dask")


def test_own_local_cluster_when_no_scheduler_is_given(small_tree, small_cache, tmp_path):
    build(
        small_tree,
        tmp_path / "c",
        BuildConfig(size=32, shard_size=7, order="sorted", workers=2, executor="dask", progress=False),
    )
    _same_cache(small_cache, tmp_path / "c")


def test_a_worker_killed_mid_build_still_gives_a_valid_cache(big_tree, tmp_path, cluster):
    cluster, client = cluster
    config = dict(size=64, shard_size=2, progress=False)
    build(big_tree, tmp_path / "local", BuildConfig(workers=1, **config))
    out = tmp_path / "dask"
    remote = _on(cluster.scheduler_address, **config)
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


def test_two_builds_at_once_on_one_cluster_do_not_share_tasks(small_tree, tmp_path, cluster):
    remote = _on(cluster[0].scheduler_address, size=16, shard_size=5)
    outcome = {}

    def run(name):
        try:
            outcome[name] = build(small_tree, tmp_path / name, remote)
        except BaseException as exc:
            outcome[name] = exc

    # daemon threads: a build that never ends fails this test instead of keeping pytest from exiting
    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a build on the shared cluster did not finish in 300 s"
    for name in ("a", "b"):
        assert not isinstance(outcome[name], BaseException), outcome[name]
        assert outcome[name].built_shards == len(outcome[name].manifest.shards) and verify(tmp_path / name).ok
    _same_cache(tmp_path / "a", tmp_path / "b")


def _running_jobs(client) -> int:
    """Shard jobs of any build executing on the cluster's workers now (cancelled ones included)."""

    def running(dask_worker=None) -> int:
        return sum(
            1
            for key, task in dask_worker.state.tasks.items()
            if str(key).startswith("cachekit-") and task.state in ("executing", "cancelled")
        )

    return sum(client.run(running).values())


def test_a_build_waits_on_its_own_client_not_on_the_default_one(small_tree, tmp_path, cluster, monkeypatch):
    """Another client of this process (another build's) becomes the default and closes while a build waits
    on its shards: the build still ends, and leaves the caller's default client alone."""
    scheduler = cluster[0].scheduler_address
    real = distributed.as_completed

    def as_completed_while_another_client_comes_and_goes(*args, **kwargs):
        other = distributed.Client(scheduler)  # the newest client is the process's default
        try:
            return real(*args, **kwargs)
        finally:
            other.close()

    monkeypatch.setattr(distributed, "as_completed", as_completed_while_another_client_comes_and_goes)
    result = _build_or_error(
        small_tree,
        tmp_path / "c",
        _on(scheduler, size=16, shard_size=5),
        120,
        "waited on a closed client's loop",
    )
    assert not isinstance(result, BaseException), result
    assert verify(tmp_path / "c").ok
    assert distributed.default_client() is cluster[1]


def _redirect_out(private_root):
    """On a dask worker: write shards into a folder of this worker's own (an --out that is not shared)."""
    import os

    from cachekit.build import shardwrite
    from cachekit.store.location import LocalLocation

    folder = os.path.join(private_root, str(os.getpid()))
    os.makedirs(folder, exist_ok=True)  # the same path exists on every worker, but each its own
    shardwrite.open_location = lambda url, storage_options=None: LocalLocation(folder)


def _restore_out():
    from cachekit.build import shardwrite
    from cachekit.store.location import open_location

    shardwrite.open_location = open_location


def test_an_out_the_workers_do_not_share_is_one_clear_error(small_tree, tmp_path, cluster):
    cluster, client = cluster
    client.run(_redirect_out, str(tmp_path / "private"))
    try:
        remote = _on(cluster.scheduler_address, size=16, shard_size=5)
        with pytest.raises(
            BuildError, match="--out must be storage that every worker and this process share, or a URL"
        ):
            build(small_tree, tmp_path / "c", remote)
    finally:
        client.run(_restore_out)
    assert not (tmp_path / "c" / "manifest.json").exists()
    written = list((tmp_path / "private").glob("*"))
    assert written  # each worker's own --out, where it wrote before the client saw nothing at its own
    assert not list((tmp_path / "private").rglob("shard-*"))  # and removed once the build failed
    assert not list((tmp_path / "private").rglob("*.tmp"))


def test_a_failed_build_on_shared_storage_keeps_its_shards_for_the_resume(small_tree, tmp_path, cluster):
    cluster, client = cluster
    out = tmp_path / "c"
    remote = _on(cluster.scheduler_address, size=16, shard_size=5)
    real, seen = run_module.write_sidecar, []

    def killed(location, result):
        real(location, result)
        seen.append(result)
        if len(seen) == 2:
            raise KeyboardInterrupt

    run_module.write_sidecar = killed
    try:
        with pytest.raises(KeyboardInterrupt):
            build(small_tree, out, remote)
    finally:
        run_module.write_sidecar = real
    assert all((out / r.info.file).exists() for r in seen)  # shared: the records keep them
    result = build(small_tree, out, remote)
    assert result.status == "resumed" and result.reused_shards >= 2 and verify(out).ok


def test_a_build_whose_client_dies_stops_its_jobs_before_they_write(big_tree, tmp_path, cluster):
    cluster, client = cluster
    out = tmp_path / "c"
    code = (
        "import sys\n"
        "from cachekit import BuildConfig, build\n"
        "config = BuildConfig(size=64, shard_size=48, executor='dask', progress=False,\n"
        "                     executor_options={'scheduler': sys.argv[3]})\n"
        "build(sys.argv[1], sys.argv[2], config)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(big_tree), str(out), cluster.scheduler_address])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _running_jobs(client):
            time.sleep(0.02)
        assert _running_jobs(client), "the build's jobs never started"
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 120  # the jobs stop at their next progress report
    while time.monotonic() < deadline and _running_jobs(client):
        time.sleep(0.05)
    assert not _running_jobs(client)
    assert not list(out.glob("shard-*")) and not list(out.glob(".shard-*"))  # nothing written after


def _hide_raw():
    """On a dask worker: RAW is not mounted here."""
    from cachekit.build.sources import reading

    def missing(path, max_bytes=0):
        raise FileNotFoundError(2, "No such file or directory", str(path))

    reading.real_read_input, reading.read_input = reading.read_input, missing


def _show_raw():
    from cachekit.build.sources import reading

    reading.read_input = reading.real_read_input


def _fails_on_the_workers(cluster, tweak, tree, out, match: str) -> BuildConfig:
    """Build ``tree`` on the cluster with ``tweak`` run on every worker first: the build must fail
    with ``match`` and write no manifest. Returns the config, for a rerun."""
    cluster, client = cluster
    remote = _on(cluster.scheduler_address, size=16, shard_size=5)
    client.run(tweak)
    try:
        with pytest.raises(BuildError, match=match):
            build(tree, out, remote)
    finally:
        client.run(_show_raw)
    assert not (out / "manifest.json").exists()
    return remote


def test_raw_the_workers_cannot_read_fails_the_build_and_the_rerun_builds(small_tree, tmp_path, cluster):
    match = r"cannot read .* RAW must be storage that every worker sees"
    remote = _fails_on_the_workers(cluster, _hide_raw, small_tree, tmp_path / "c", match)
    result = build(
        small_tree, tmp_path / "c", remote
    )  # the mount fixed: everything is built, nothing skipped
    assert result.status == "built" and result.skipped == 0 and result.manifest.num_samples == 40


def _other_raw():
    """On a dask worker: a RAW of its own, whose files differ from the client's."""
    from cachekit.build.sources import reading

    real = reading.read_input
    reading.real_read_input, reading.read_input = (
        real,
        lambda path, max_bytes=0: real(path, max_bytes) + b"\0" * 10,
    )


def test_workers_that_see_other_bytes_than_the_client_fail_the_build(small_tree, tmp_path, cluster):
    match = r"the client listed .* every worker sees the same"
    _fails_on_the_workers(cluster, _other_raw, small_tree, tmp_path / "c", match)


@pytest.mark.slow
def test_progress_advances_per_sample_under_dask(big_tree, tmp_path, cluster, monkeypatch):
    import tqdm

    updates = []

    class Recorder(tqdm.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm, "tqdm", Recorder)
    remote = _on(cluster[0].scheduler_address, size=16, shard_size=48, progress=True)
    build(big_tree, tmp_path / "c", remote)
    assert sum(updates) == 96 and len([n for n in updates if n]) >= 4 and max(updates) <= 32


def test_unreachable_scheduler_is_one_clear_error(small_tree, tmp_path, monkeypatch):
    from cachekit import UsageError
    from cachekit.build import executors

    monkeypatch.setattr(executors, "DASK_CONNECT_TIMEOUT", "2s")
    bad = _on("tcp://127.0.0.1:9", size=32)
    with pytest.raises(UsageError, match="cannot reach the dask scheduler"):
        build(small_tree, tmp_path / "c", bad)


def test_a_cluster_without_workers_is_one_error_not_a_wait_for_ever(small_tree, tmp_path, monkeypatch):
    executors = importlib.import_module("cachekit.build.executors")
    monkeypatch.setattr(executors, "DASK_NO_WORKERS_S", 2)
    with distributed.LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as empty:
        config = _on(empty.scheduler_address, size=16)
        error = _build_or_error(small_tree, tmp_path / "c", config, 300, "waited for ever without workers")
    assert isinstance(error, BuildError), error
    assert "has had no worker for 2 s while" in str(error) and "--executor local" in str(error)
    assert not list(tmp_path.glob("c/shard-*"))
