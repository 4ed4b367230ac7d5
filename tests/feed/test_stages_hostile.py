"""Profiling never stops or slows a run into a lie: a full disk, a line cut short, a loader nobody
reads, a child forked from the training process, a trace path that cannot be written."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import cachekit.feed.stages as stages
from cachekit import BuildConfig, build, make_loader
from cachekit.tools.doctorloop import time_steps
from cachekit.tools.synthetic import make_synthetic_folder
from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

SAMPLES = 16
AUGMENT = [RandomResizedCrop(24), RandomHorizontalFlip()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages_hostile")
    raw = make_synthetic_folder(root / "raw", SAMPLES, classes=2, size=(40, 40), seed=4)
    build(raw, root / "jpeg", BuildConfig(store="jpeg", size=32, shard_size=8, workers=1, progress=False))
    return root / "jpeg"


def _decodes(events) -> int:
    return sum(e["name"] == "cachekit.decode" for e in events if e["ph"] == "X")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_disk_stops_the_timing_not_the_run(cache, monkeypatch, workers):
    real = os.write

    def full(fd, data):
        if os.fstat(fd).st_nlink and "cachekit-stages-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(stages.os, "write", full)  # forked workers inherit it
    loader = make_loader(cache, 4, workers=workers, augment=AUGMENT, profile=True, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [b for _ in range(2) for b in loader]
        events = loader.stage_events()
    assert len(batches) == 2 * SAMPLES // 4  # every batch of both passes
    assert _decodes(events) == 0
    if workers == 0:  # one warning in this process, not one a batch
        said = [w for w in caught if "no longer timed" in str(w.message)]
        assert len(said) == 1 and "No space left" in str(said[0].message)


def test_a_line_cut_short_is_skipped_and_the_rest_read(cache):
    loader = make_loader(cache, 4, augment=AUGMENT, profile=True, prefetch_thread=False, seed=0)
    list(loader)
    folder = loader.stage_log.folder
    with open(os.path.join(folder, "99999999.0.jsonl"), "w") as dead:  # a worker killed mid-write
        dead.write('["decode", 1, 17\n[1, 2]\n{"a": 1}\n["thread"]\n')
    events = loader.stage_events()
    assert _decodes(events) == SAMPLES
    assert not [e for e in events if e["pid"] == 99999999]


def test_the_training_process_holds_a_bounded_number_of_events_nobody_reads(cache, monkeypatch):
    monkeypatch.setattr(stages, "FLUSH_EVENTS", 10)
    loader = make_loader(cache, 4, augment=AUGMENT, profile=True, seed=0)
    for _ in range(3):
        list(loader)
    own = stages.clock(loader.stage_log.folder)
    assert len(own._pending) <= 10
    assert _decodes(loader.stage_events()) == 3 * SAMPLES  # written out as it went, none lost


def test_every_read_names_the_threads_its_events_ran_in(cache):
    loader = make_loader(cache, 4, workers=2, augment=AUGMENT, profile=True, seed=0)
    for _ in range(2):
        list(loader)
        events = loader.stage_events()
        rows = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
        named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert rows and rows == named  # the second read too, though its threads were named in the first


def test_a_child_forked_by_the_training_script_leaves_the_loader_s_folder(cache, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        from cachekit import make_loader
        loader = make_loader({str(cache)!r}, 4, profile=True)
        list(loader)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # exits as Python does: its exit handlers run
        os.waitpid(pid, 0)
        print(os.path.isdir(loader.stage_log.folder), sum(e["ph"] == "X" for e in loader.stage_events()))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    alive, events = done.stdout.split()
    assert alive == "True" and int(events) > 0


def test_a_collected_loader_leaves_no_folder_and_no_clock(cache):
    loader = make_loader(cache, 4, profile=True)
    list(loader)
    folder = loader.stage_log.folder
    assert folder in stages._clocks
    del loader
    gc.collect()
    assert folder not in stages._clocks and not os.path.exists(folder)


class _Order:
    """A probe that records when it was made ready and when the first timed step began."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def prepare(self) -> None:
        self.calls.append(("prepare", time.perf_counter()))

    def begin(self, origin: float) -> None:
        self.calls.append(("begin", origin))

    def step(self, index, start, got, done) -> None:
        self.calls.append(("step", start))

    def end(self) -> None:
        self.calls.append(("end", 0.0))


@pytest.mark.parametrize("warmup", [0, 2])
def test_a_probe_is_made_ready_before_the_first_timed_step_starts_its_clock(cache, warmup):
    """A profiler's start (a second or two) falls between steps: no timed step counts it."""
    probe = _Order()
    time_steps(make_loader(cache, 4, seed=0), lambda images, labels: None, 3, probes=[probe], warmup=warmup)
    names = [name for name, _ in probe.calls]
    assert names == ["prepare", "begin", "step", "step", "step", "end"]
    assert probe.calls[0][1] <= probe.calls[1][1]  # prepared before the first timed step's clock started
