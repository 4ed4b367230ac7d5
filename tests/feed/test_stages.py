"""A profiled loader times its stages where they run (its threads, its worker processes), on the clock of
torch's profiler, and that timing changes nothing in the batches."""

from __future__ import annotations

import collections
import gc
import json
import os
import re
import time
from pathlib import Path

import pytest
import torch

import cachekit.feed.stages as stages
from cachekit import BuildConfig, UsageError, add_stages, build, make_loader, stage_times, trace_handler
from cachekit.tools.synthetic import make_synthetic_folder
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import MixUp, RandomHorizontalFlip, RandomResizedCrop

SAMPLES = 24


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """The same 24 pictures stored as JPEG and as pixels; and a cache with boxes and masks."""
    root = tmp_path_factory.mktemp("stages")
    raw = make_synthetic_folder(root / "raw", SAMPLES, classes=3, size=(48, 48), seed=3)
    config = dict(size=40, shard_size=8, workers=1, progress=False)
    build(raw, root / "jpeg", BuildConfig(store="jpeg", **config))
    build(raw, root / "pixels", BuildConfig(**config))
    objects = make_object_dataset(root / "objects", 8, size=(64, 80), classes=3)
    build(objects, root / "masks", BuildConfig(annotations="yolo", masks=str(objects / "masks"), size=48,
                                               workers=1, progress=False, min_visibility=0.0))  # fmt: skip
    return {"jpeg": root / "jpeg", "pixels": root / "pixels", "masks": root / "masks"}


AUGMENT = [RandomResizedCrop(24), RandomHorizontalFlip(), MixUp(alpha=0.4, num_classes=3)]


def _counts(events) -> collections.Counter:
    return collections.Counter(e["name"].removeprefix("cachekit.") for e in events if e["ph"] == "X")


def _pass(loader) -> list:
    return [[t.clone() if isinstance(t, torch.Tensor) else t for t in batch] for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_s_stages_are_timed_once_a_pass_in_the_process_that_ran_them(caches, workers):
    loader = make_loader(caches["jpeg"], 8, workers=workers, augment=AUGMENT, profile=True, device="cpu", seed=1)
    before = time.time_ns() / 1e3
    _pass(loader)
    after = time.time_ns() / 1e3
    events = loader.stage_events()
    counts = _counts(events)
    # each sample decoded and augmented once; each of the 3 batches fetched, mixed, collated, copied once
    assert counts == {"decode": SAMPLES, "augment": SAMPLES, "fetch": 3, "batch_ops": 3, "collate": 3, "copy": 3}
    timed = [e for e in events if e["ph"] == "X"]
    assert all(before <= e["ts"] and e["ts"] + e["dur"] <= after and e["dur"] >= 0 for e in timed)
    me = os.getpid()
    copies = {e["pid"] for e in timed if e["name"] == "cachekit.copy"}
    reads = {e["pid"] for e in timed if e["name"] == "cachekit.decode"}
    assert copies == {me}  # the copy is this process's
    assert (reads == {me}) if workers == 0 else (len(reads) == 2 and me not in reads)  # each worker its share
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M"}
    assert {(e["pid"], e["tid"]) for e in timed} <= threads  # every row named
    assert loader.stage_events() == []  # drained: the next call has only what ran since


def test_a_cache_with_targets_times_their_reading_moving_and_masks_and_a_plain_read_is_a_read(caches):
    loader = make_loader(caches["masks"], 4, augment=[RandomResizedCrop(32)], profile=True, seed=0)
    _pass(loader)
    counts = _counts(loader.stage_events())
    assert counts["targets"] == 2 * 2  # read, then moved, in each of the 2 batches
    assert counts["masks"] == counts["augment"] == 8
    plain = make_loader(caches["pixels"], 8, profile=True, seed=0)
    _pass(plain)
    assert _counts(plain.stage_events()) == {"read": SAMPLES, "fetch": 3, "collate": 3, "copy": 3}


def test_timing_changes_no_batch(caches):
    def batches(profile, workers):
        loader = make_loader(caches["jpeg"], 8, workers=workers, augment=AUGMENT, profile=profile, seed=5)
        return _pass(loader)

    plain = batches(False, 0)
    for got in (batches(True, 0), batches(True, 2)):
        for a, b in zip(plain, got, strict=True):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_an_unprofiled_loader_says_how_to_profile_it_and_a_profiled_one_cleans_up(caches):
    with pytest.raises(UsageError, match=r"make_loader\(\.\.\., profile=True\)"):
        make_loader(caches["pixels"], 8).stage_events()
    with pytest.raises(TypeError, match="profile must be True or False"):
        make_loader(caches["pixels"], 8, profile="yes")
    loader = make_loader(caches["pixels"], 8, profile=True)
    folder = loader.stage_log.folder
    _pass(loader)
    assert os.path.isdir(folder) and os.listdir(folder)
    del loader
    gc.collect()
    assert not os.path.exists(folder)


def test_a_process_s_file_is_started_afresh_past_its_size_and_the_newest_events_are_read(caches, monkeypatch):
    monkeypatch.setattr(stages, "ROTATE_BYTES", 2000)
    loader = make_loader(caches["jpeg"], 8, augment=AUGMENT, profile=True, prefetch_thread=False, seed=1)
    for _ in range(6):
        _pass(loader)
    files = os.listdir(loader.stage_log.folder)
    assert len(files) == 2, files  # the one being written and the one before it
    loader.stage_events()
    _pass(loader)
    assert _counts(loader.stage_events())["decode"] == SAMPLES  # the last pass, whole


def _profiled(loader, path: str) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for images, *_ in loader:
            torch.nn.functional.avg_pool2d(images.float(), 2)
    prof.export_chrome_trace(path)


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_the_stages_join_a_torch_profiler_trace_on_its_clock(caches, tmp_path, name):
    """torch's profiler records the thread that started it; the stages of the prefetch thread, the
    threads over the batch and the worker processes are added to its trace, lined up with its ops."""
    loader = make_loader(caches["jpeg"], 8, workers=2, augment=AUGMENT, profile=True, device="cpu", seed=1)
    path = str(tmp_path / name)
    _profiled(loader, path)
    added = add_stages(path, loader)
    trace = json.loads(__import__("gzip").open(path, "rt").read() if name.endswith(".gz") else open(path).read())
    events = trace["traceEvents"]
    ours = [e for e in events if e.get("cat") == "cachekit"]
    assert added == len(ours) and _counts(ours)["decode"] == SAMPLES
    pools = [e for e in events if e.get("name") == "aten::avg_pool2d"]
    copies = sorted(e["ts"] for e in ours if e["name"] == "cachekit.copy")
    assert len(pools) == 3 and len(copies) == 3
    for pool, copy in zip(sorted(pools, key=lambda e: e["ts"]), copies):
        assert copy < pool["ts"]  # each batch is copied before the step that uses it runs, on one clock
        assert pool["ts"] - copy < 5e6  # and not seconds apart
    workers = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sum(n.startswith("cachekit worker") for n in workers) == 2


def test_a_tensorboard_handler_writes_the_profiled_steps_with_their_stages(caches, tmp_path):
    loader = make_loader(caches["jpeg"], 4, augment=AUGMENT, profile=True, seed=1)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=trace_handler(loader, tmp_path / "tb", "w0")) as p:
        for _ in loader:
            p.step()
    (written,) = list((tmp_path / "tb").iterdir())
    assert written.name.startswith("w0.") and written.name.endswith(".pt.trace.json")
    counts = _counts(e for e in json.loads(written.read_text())["traceEvents"] if e.get("cat") == "cachekit")
    # the three active steps' copies, and the reads ahead that made their batches (before them)
    assert counts["copy"] >= 3 and counts["decode"] >= 4 and counts["collate"] >= 1


def test_a_stage_s_own_time_leaves_out_the_stages_nested_in_it():
    def event(name, ts, dur, tid=1):
        return {"ph": "X", "name": f"cachekit.{name}", "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    times = stage_times([
        event("augment", 0, 100), event("decode", 10, 30), event("decode", 50, 20),  # nested: 50 own
        event("collate", 200, 40), event("augment", 0, 60, tid=2), event("other", 0, 1e6, tid=3),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "x"}},
        {"ph": "X", "name": "aten::add", "pid": 1, "tid": 1, "ts": 0, "dur": 1e9},  # not ours
    ])  # fmt: skip
    assert times == pytest.approx({"other": 1.0, "augment": 110e-6, "decode": 50e-6, "collate": 40e-6})
    assert list(times)[:2] == ["other", "augment"]  # the costliest first


def test_the_documented_profiled_loop_runs_as_written(caches, tmp_path, monkeypatch):
    text = (Path(__file__).resolve().parents[2] / "docs" / "TRAINING.md").read_text(encoding="utf-8")
    (code,) = [c for c in re.findall(r"```python\n(.*?)```", text, re.S) if "cachekit.trace_handler(loader" in c]
    old = '"cache/", batch_size=64'
    assert old in code, "TRAINING changed: its profiled loop no longer reads cache/"
    code = code.replace(old, f"{str(caches['jpeg'])!r}, batch_size=4")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/TRAINING.md", "exec"), {})
    (written,) = list((tmp_path / "log").iterdir())
    names = {e["name"] for e in json.loads(written.read_text())["traceEvents"] if e.get("cat") == "cachekit"}
    assert {"cachekit.decode", "cachekit.augment", "cachekit.collate", "cachekit.copy"} <= names
