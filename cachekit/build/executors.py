"""Where shard jobs run: local worker processes, or a dask cluster.

Every executor takes the same picklable jobs and yields ``(job, result)`` as jobs finish, reporting
per-sample progress through a callback, so the build code does not know where the work happened.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

from ..errors import BuildError, CachekitError, UsageError
from ..image.threads import opencv_single_threaded
from .pool import run_pool

__all__ = ["run_jobs", "EXECUTORS"]

EXECUTORS = ("local", "dask")

#: Times dask re-runs a shard job that raised (a lost worker is re-scheduled by dask itself).
DASK_RETRIES = 2
#: How long to try reaching an existing dask scheduler.
DASK_CONNECT_TIMEOUT = "30s"
#: How long a failed build waits for its cancelled jobs to stop before it cleans up after them (s).
DASK_UNDO_WAIT_S = 30
#: How long a build waits while the dask cluster has no worker at all before it gives up (s): its
#: jobs would otherwise wait for ever (a cluster whose workers all died, or never joined).
DASK_NO_WORKERS_S = 120


def _describe(job) -> str:
    return f"shard {getattr(job, 'file', job)}"


def _run_local(fn, jobs, workers, on_progress) -> Iterator:
    with opencv_single_threaded():  # no OpenCV pool alive while workers are forked
        yield from run_pool(fn, jobs, workers, on_progress, _describe)


class JobCancelled(BuildError):
    """A shard job whose build no longer wants it (cancelled, or its client died): stopped before
    it writes its shard."""


def _still_wanted(worker, key) -> bool:
    """False once the scheduler released the running task ``key`` (its client cancelled it or died)."""
    try:
        task = worker.state.tasks.get(key)
    except AttributeError:  # a distributed without WorkerState: never stop early
        return True
    return task is not None and task.state not in ("cancelled", "released", "forgotten")


def _call_on_dask_worker(fn, job, topic: str):
    """A shard job on a dask worker: OpenCV on one thread, progress sent to the client as events.

    Each progress report (every 16 inputs, and the last one before the shard is written) first
    asks whether the build still wants the job: a job its client cancelled, or whose client died,
    stops there and writes nothing.
    """
    import cv2
    from dask.distributed import get_worker

    cv2.setNumThreads(1)
    worker = get_worker()
    key = worker.get_current_task()
    done = 0

    def progress(n: int) -> None:
        nonlocal done
        if not _still_wanted(worker, key):
            raise JobCancelled(f"{_describe(job)}: its build let it go (cancelled, or its client died)")
        done += n
        if n:
            worker.log_event(topic, (job.index, done))

    return fn(job, progress)


class _DaskProgress:
    """Per-sample progress from dask workers' events; a job re-run elsewhere is never counted twice."""

    def __init__(self, on_progress: Callable[[int], None]) -> None:
        self.on_progress = on_progress
        self.done: dict[int, int] = {}
        self.lock = threading.Lock()

    def set(self, index: int, done: int) -> None:
        with self.lock:
            before = self.done.get(index, 0)
            if done > before:
                self.done[index] = done
                self.on_progress(done - before)

    def event(self, event) -> None:
        _, (index, done) = event
        self.set(index, done)


def _run_dask(fn, jobs, workers, on_progress, scheduler: str | None = None, undo=None) -> Iterator:
    """``undo``: run on every worker when the build fails (its jobs cancelled first), e.g. to remove
    the shards it wrote where only that worker sees them."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise UsageError("--executor dask needs dask: pip install 'cachekit-vision[dask]'") from None
    cluster = None
    # The build's client is never the process's default: as_completed and friends would otherwise follow
    # whichever client came last (another build's, in another thread) and wait on its loop after it closed.
    try:
        if scheduler:
            client = Client(scheduler, timeout=DASK_CONNECT_TIMEOUT, set_as_default=False)
        else:
            cluster = LocalCluster(
                n_workers=max(1, min(workers, len(jobs))),  # no idle processes, whatever --workers says
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                silence_logs=logging.CRITICAL,  # a failed job is reported once, by the build
            )
            client = Client(cluster, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise UsageError(f"cannot reach the dask scheduler {scheduler}: {exc}") from None
    build_id = uuid.uuid4().hex[:16]  # task keys and events of this build only, whoever else runs
    topic = f"cachekit-progress-{build_id}"
    progress = _DaskProgress(on_progress)
    finished = False
    try:
        client.subscribe_topic(topic, progress.event)
        futures = {
            client.submit(
                _call_on_dask_worker,
                fn,
                job,
                topic,
                retries=DASK_RETRIES,
                pure=False,
                key=f"cachekit-{build_id}-{job.index}",
            ): job
            for job in jobs
        }
        try:
            for future in _completed(client, futures, as_completed, scheduler or "of the build"):
                job = futures[future]
                try:
                    result = future.result()  # raises the job's own error once its retries are spent
                except BuildError as exc:
                    if str(exc).startswith("cannot write shard") and "must be storage" not in str(exc):
                        raise BuildError(
                            f"{exc} (on a dask worker: --out must be storage that every worker and this "
                            "process share, or a URL)"
                        ) from None
                    raise
                except CachekitError:
                    raise
                except Exception as exc:
                    text = " ".join(str(exc).split())[:300]
                    raise BuildError(f"dask: {_describe(job)} failed: {type(exc).__name__}: {text}") from None
                progress.set(job.index, len(getattr(job, "paths", ())) or 1)
                yield job, result
            finished = True
        finally:
            client.cancel(list(futures))
            if not finished and undo is not None:
                _undo_on_workers(client, f"cachekit-{build_id}-", undo)
    finally:
        with contextlib.suppress(Exception):
            client.unsubscribe_topic(topic)
        client.close()
        if cluster is not None:
            cluster.close()


def _completed(client, futures: dict, as_completed, where: str) -> Iterator:
    """``futures`` as they finish (on ``client``'s own loop); a ``BuildError`` once the cluster has
    had no worker for ``DASK_NO_WORKERS_S`` seconds while some still wait."""
    pending = as_completed(futures, loop=client.loop)
    left, idle_since, checked = len(futures), None, 0.0
    while left:
        batch = pending.next_batch(block=False)
        if batch:
            left -= len(batch)
            idle_since = None
            yield from batch
            continue
        now = time.monotonic()
        if now - checked >= 1.0:
            checked = now
            try:
                workers = len(client.nthreads())
            except Exception:  # the scheduler is busy or gone: its own errors reach the futures
                workers = None
            if workers != 0:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= DASK_NO_WORKERS_S:
                raise BuildError(
                    f"dask: the scheduler {where} has had no worker for {DASK_NO_WORKERS_S} s while "
                    f"{left} shard job(s) wait: start workers on the cluster, or build with --executor local"
                )
        time.sleep(0.02)


def _running(prefix: str, dask_worker=None) -> int:
    """On a worker: how many of its tasks whose key starts with ``prefix`` are still running."""
    try:
        return sum(
            1
            for key, task in dask_worker.state.tasks.items()
            if str(key).startswith(prefix) and task.state in ("executing", "cancelled", "long-running")
        )
    except AttributeError:
        return 0


def _undo_on_workers(client, prefix: str, undo) -> None:
    """Once the cancelled jobs have stopped (a running one stops at its next progress report, at
    the latest before it writes its shard), run ``undo`` on every worker; errors are left be."""
    deadline = time.monotonic() + DASK_UNDO_WAIT_S
    with contextlib.suppress(Exception):
        while time.monotonic() < deadline and any(client.run(_running, prefix, on_error="ignore").values()):
            time.sleep(0.1)
    with contextlib.suppress(Exception):
        client.run(undo, on_error="ignore")


def run_jobs(
    fn: Callable,
    jobs: Sequence,
    *,
    workers: int,
    executor: str = "local",
    on_progress: Callable[[int], None] = lambda n: None,
    **options,
) -> Iterator:
    """Run ``fn(job, progress)`` for every job; yield ``(job, result)`` in completion order.

    ``executor="dask"`` takes ``scheduler="tcp://host:8786"`` (an existing cluster; every worker
    must reach the raw and cache folders) or starts a LocalCluster of ``workers`` processes, and
    ``undo``: what every worker runs when the jobs fail or are given up (the local executor needs none).
    """
    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")
    if executor == "dask":
        unknown = set(options) - {"scheduler", "undo"}
        if unknown:
            raise UsageError(f"the dask executor takes only a scheduler, not {', '.join(sorted(unknown))}")
        return _run_dask(fn, jobs, workers, on_progress, **options)
    options.pop("undo", None)  # local workers write where the build runs: its own records clean up
    if options:
        raise UsageError(f"the local executor takes no options ({', '.join(options)})")
    return _run_local(fn, jobs, workers, on_progress)
