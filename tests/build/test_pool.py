"""The local worker pool: results and errors come back; a crash is one named error; nothing is left."""

from __future__ import annotations

import os
import signal
import sys
import tempfile

import pytest

from cachekit import BuildError
from cachekit.build.pool import WorkerCrashed, run_pool


def _square(job, progress):
    progress(1)
    return job * job


def _crash_on_three(job, progress):
    if job == 3:
        print("libfoo: something went very wrong", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    return job


def _fail_on_two(job, progress):
    if job == 2:
        raise BuildError("cannot write shard 2: disk full")
    return job


def _logs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("cachekit-worker-")}


@pytest.mark.parametrize("workers", [1, 2])
def test_results_progress_and_errors_come_back(workers):
    before, seen = _logs(), []
    results = dict(run_pool(_square, range(6), workers, seen.append, str))
    assert results == {j: j * j for j in range(6)} and sum(seen) == 6
    with pytest.raises(BuildError, match="disk full"):
        list(run_pool(_fail_on_two, range(4), workers, lambda n: None, str))
    assert _logs() == before  # the workers' stderr logs are gone


def test_a_crashed_worker_is_named_with_its_last_words():
    before = _logs()
    with pytest.raises(
        WorkerCrashed, match=r"died \(SIGSEGV\) while building shard 3; its last message: libfoo"
    ):
        list(run_pool(_crash_on_three, range(5), 2, lambda n: None, lambda j: f"shard {j}"))
    assert _logs() == before
