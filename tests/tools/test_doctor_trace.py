"""cachekit doctor --trace: the timed steps under torch.profiler, every loader stage a named range in the
trace a viewer opens, and the stage that costs the most printed."""

from __future__ import annotations

import json
import os
import re

import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, build
from cachekit.cli import main
from cachekit.feed.stages import STAGES
from cachekit.tools.doctor import diagnose
from cachekit.tools.synthetic import make_synthetic_folder
from cachekit.tools.synthetic_objects import make_object_dataset


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor_trace")
    raw = make_synthetic_folder(root / "raw", 32, classes=4, size=(48, 48), seed=2)
    build(raw, root / "jpeg", BuildConfig(store="jpeg", size=40, shard_size=8, workers=1, progress=False))
    objects = make_object_dataset(root / "objects", 8, size=(64, 80), classes=3)
    build(objects, root / "masks", BuildConfig(annotations="yolo", masks=str(objects / "masks"), size=48,
                                               workers=1, progress=False, min_visibility=0.0))  # fmt: skip
    return root


def _names(path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for event in json.load(open(path))["traceEvents"]:
        if event.get("cat") == "cachekit":
            found.setdefault(event["name"].removeprefix("cachekit."), []).append(event)
    return found


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_trace_holds_every_stage_and_the_costliest_is_printed(caches, tmp_path, workers):
    out = tmp_path / "trace.json"
    augment = "RandomResizedCrop(32),RandomHorizontalFlip(),ColorJitter(0.3,0.3,0.3),MixUp(alpha=0.4,num_classes=4)"
    steps = 6
    args = ["doctor", str(caches / "jpeg"), "--batch-size", "4", "--steps", str(steps), "--step-ms", "2",
            "--workers", workers, "--augment", augment, "--json", str(tmp_path / "d.json"), "--trace", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    found = _names(out)
    assert {"fetch", "decode", "augment", "batch_ops", "collate", "copy"} <= set(found)
    assert len(found["step"]) == len(found["wait for data"]) == steps  # the timed steps, each its two ranges
    report = json.load(open(tmp_path / "d.json"))
    waits = sorted(found["wait for data"], key=lambda e: e["ts"])
    assert [e["dur"] / 1e6 for e in waits] == pytest.approx(report["timeline"]["wait_s"], abs=1e-6)
    costliest = max(report["stages"], key=report["stages"].get)
    line = next(x for x in result.output.splitlines() if x.startswith("stages:"))
    assert line.endswith(f"the most: {costliest}") and re.search(rf"stages:\s+{costliest} ", line)
    assert f"trace:       {out}" in result.output
    pids = {e["pid"] for events in found.values() for e in events}
    assert len(pids) == (1 if workers == "0" else 3)  # the workers' stages are in the trace too
    assert {e["pid"] for e in found["decode"]} != {os.getpid()} or workers == "0"


def test_targets_masks_and_plain_reads_are_stages_of_their_own(caches, tmp_path):
    seen: set[str] = set()
    for cache, augment in (("masks", "RandomResizedCrop(32)"), ("jpeg", None)):
        path = tmp_path / f"{cache}.json"
        report = diagnose(caches / cache, batch_size=4, steps=3, step_ms=1, workers=0, augment=augment, trace=path)
        seen |= set(_names(path))
        assert report.trace == str(path) and set(report.stages) <= set(STAGES)
    assert set(STAGES) <= seen  # a JPEG store without augmentation decodes, then copies (a read)
    plain = tmp_path / "plain.json"
    pixels = caches / "pixels"
    build(caches / "raw", pixels, BuildConfig(size=40, shard_size=8, workers=1, progress=False))
    diagnose(pixels, batch_size=4, steps=8, step_ms=1, workers=0, trace=plain)  # reads run 2 batches ahead
    assert "read" in _names(plain)


def test_a_trace_that_cannot_be_written_is_one_line_before_the_run(caches, tmp_path):
    args = ["doctor", str(caches / "jpeg"), "--steps", "2", "--step-ms", "1"]
    bad = [(tmp_path / "nope" / "t.json", "its folder does not exist"), (tmp_path, "a folder is not one"),
           ("", "give a file name"), (f"{tmp_path}/", "give a file name")]  # fmt: skip
    if os.path.isdir("/proc/self"):  # a special file system: nothing can be made there, root or not
        bad.append(("/proc/trace.json", "not writable"))
    for target, reason in bad:
        result = CliRunner().invoke(main, [*args, "--trace", str(target)])
        assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
        assert reason in result.output and "waiting:" not in result.output
