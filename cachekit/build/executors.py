"""Where shard jobs run: in this process, a pool of local worker processes, or a dask cluster.

Every executor takes the same picklable jobs and yields ``(job, result)`` as jobs finish, reporting
per-sample progress through a callback, so the build code does not know where the work happened.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from ..constants import START_METHOD_ENV
from ..errors import UsageError

__all__ = ["run_jobs", "EXECUTORS"]

EXECUTORS = ("local", "dask")

#: Times dask re-runs a shard job that raised (a lost worker is re-scheduled by dask itself).
DASK_RETRIES = 2

_progress_queue = None


def _init_worker(progress_queue) -> None:
    global _progress_queue
    _progress_queue = progress_queue
    import cv2

    cv2.setNumThreads(1)  # one core per worker process; the pool provides the parallelism


def _report(n: int) -> None:
    if _progress_queue is not None:
        _progress_queue.put(n)


def _call(fn, job):
    return fn(job, _report)


def _context() -> mp.context.BaseContext:
    """How worker processes start: ``CACHEKIT_START_METHOD``, else fork where the OS has it.

    fork starts a pool in milliseconds with every module already imported; forkserver or spawn
    import torch afresh in each pool (~2.5 s measured here), which costs a small build its
    scaling. The parent has touched no OpenMP region when the pool starts (the build only
    decodes in workers), and each worker resets OpenCV's thread pool to one thread.
    """
    method = os.environ.get(START_METHOD_ENV) or ("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    if method not in mp.get_all_start_methods():
        raise UsageError(f"{START_METHOD_ENV}={method!r} is not available here")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["cachekit.shardjob"])
    return ctx


@contextlib.contextmanager
def _single_threaded_opencv():
    """OpenCV on one thread while jobs run: workers are the parallelism.

    Also what makes fork safe: a child forked while OpenCV's thread pool is alive deadlocks in
    its first OpenCV call, so the parent's pool is shut down before the workers are forked.
    """
    import cv2

    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(threads)


def _run_inline(fn, jobs, on_progress) -> Iterator:
    with _single_threaded_opencv():
        for job in jobs:
            yield job, fn(job, on_progress)


def _run_pool(fn, jobs, workers, on_progress) -> Iterator:
    ctx = _context()
    progress_queue = ctx.Queue()

    def drain() -> None:
        while True:
            try:
                on_progress(progress_queue.get_nowait())
            except queue_mod.Empty:
                return

    with (
        _single_threaded_opencv(),
        ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(progress_queue,)
        ) as pool,
    ):
        futures = {pool.submit(_call, fn, job): job for job in jobs}
        try:
            while futures:
                done, _ = wait(futures, timeout=0.2, return_when=FIRST_COMPLETED)
                drain()
                for fut in done:
                    job = futures.pop(fut)
                    yield job, fut.result()
        finally:
            for fut in futures:
                fut.cancel()
            drain()


def _call_on_dask_worker(fn, job):
    """A shard job on a dask worker: OpenCV on one thread, as in a local worker process."""
    import cv2

    cv2.setNumThreads(1)
    return fn(job, None)


def _run_dask(fn, jobs, workers, on_progress, scheduler: str | None = None) -> Iterator:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise UsageError("--executor dask needs dask: pip install 'cachekit-vision[dask]'") from None
    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout="30s")
        else:
            cluster = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
            )
            client = Client(cluster)
    except (OSError, TimeoutError) as exc:
        raise UsageError(f"cannot reach the dask scheduler {scheduler}: {exc}") from None
    try:
        futures = {
            client.submit(
                _call_on_dask_worker, fn, job, retries=DASK_RETRIES, pure=False, key=f"cachekit-{job.file}"
            ): job
            for job in jobs
        }
        try:
            for future in as_completed(futures):
                job = futures[future]
                result = future.result()  # raises the job's own error once its retries are spent
                on_progress(len(getattr(job, "paths", ())) or 1)
                yield job, result
        finally:
            client.cancel(list(futures))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


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
    must reach the raw and cache folders) or starts a LocalCluster of ``workers`` processes.
    """
    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")
    if executor == "dask":
        unknown = set(options) - {"scheduler"}
        if unknown:
            raise UsageError(f"the dask executor takes only a scheduler, not {', '.join(sorted(unknown))}")
        return _run_dask(fn, jobs, workers, on_progress, **options)
    if options:
        raise UsageError(f"the local executor takes no options ({', '.join(options)})")
    if workers <= 1 or len(jobs) <= 1:
        return _run_inline(fn, jobs, on_progress)
    return _run_pool(fn, jobs, min(workers, len(jobs)), on_progress)
