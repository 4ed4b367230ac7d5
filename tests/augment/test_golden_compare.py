"""The golden record's digests and comparison (``benchmarks/goldenvalues.py``): a batch's digest names
each output and follows every bit; ``compare`` names the case, the batch and what changed; a device
case's images, stored as their difference from its threads case's, agree within a level (a few values
further where a step amplifies a level) and fail beyond, named; every other output stays exact; a record
of other kernels is named, not compared. The comparison is tested on runs made here, so it passes on
any machine; the cases against the record, in ``test_golden_outputs.py``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from goldenkit import CASES, EXPECTED, as_actual, golden, golden_caches, goldenvalues


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (2, 3, 6, 8), generator=g, dtype=torch.uint8)
    targets = [
        {"boxes": torch.tensor([[1.0, 2.0, 5.0, 6.0]]), "classes": torch.tensor([2])},
        {"boxes": torch.zeros((0, 4)), "classes": torch.zeros((0,), dtype=torch.int64)},
    ]
    return images, targets


def test_a_batch_digest_names_each_output_and_follows_every_bit():
    images, targets = _batch()
    base = goldenvalues.digest_batch((images, targets))
    assert set(base) == {"images", "targets[].boxes", "targets[].classes"}
    assert goldenvalues.digest_batch((images.clone(), copy.deepcopy(targets))) == base
    assert len(base["images"]) == goldenvalues.DIGITS
    one = images.clone()
    one[1, 2, 5, 7] ^= 1  # the last bit of the last pixel
    flipped = goldenvalues.digest_batch((one, targets))
    assert flipped["images"] != base["images"] and flipped["targets[].boxes"] == base["targets[].boxes"]
    moved = copy.deepcopy(targets)
    moved[0]["boxes"][0, 3] = 6.5
    assert goldenvalues.digest_batch((images, moved))["targets[].boxes"] != base["targets[].boxes"]
    # a box that moves from one sample to the next, the same values in the same order: another batch
    swapped = [targets[1], targets[0]]
    assert goldenvalues.digest_batch((images, swapped))["targets[].boxes"] != base["targets[].boxes"]
    # the same bytes as another dtype or shape
    assert goldenvalues.digest_batch((images.view(2, 3, 8, 6), targets))["images"] != base["images"]
    assert goldenvalues.digest_batch((images.view(torch.int8), targets))["images"] != base["images"]
    # the same values channels-last: named so
    last = goldenvalues.digest_batch((images.contiguous(memory_format=torch.channels_last), targets))
    assert last["images"] != base["images"] and last["targets[].boxes"] == base["targets[].boxes"]
    scalar = goldenvalues.digest_batch((images, torch.tensor(0.5)))["labels"]
    assert scalar != goldenvalues.digest_batch((images, torch.tensor(0.25)))["labels"]
    assert scalar != goldenvalues.digest_batch((images, torch.tensor([0.5])))["labels"]
    labels = goldenvalues.digest_batch((images, torch.tensor([0, 1]), torch.tensor([[6, 8], [6, 8]])))
    assert set(labels) == {"images", "labels", "out2"}
    assert goldenvalues.digest_batch((images, np.array([0.5, 0.5]))) != goldenvalues.digest_batch(
        (images, np.array([0.5, 0.25]))
    )


def test_compare_names_the_case_the_batch_and_the_key():
    actual = copy.deepcopy(EXPECTED)
    assert goldenvalues.compare(EXPECTED, actual) == []
    name = "det.RandomRotation.device"
    actual["cases"][name][4]["targets[].boxes"] = "0" * goldenvalues.DIGITS
    actual["cases"][name][7]["images"] = "1" * goldenvalues.DIGITS
    assert goldenvalues.compare(EXPECTED, actual) == [
        f"{name}: batch 4 (epoch 1, batch 1): targets[].boxes differ; 1 later batches differ too"
    ]
    other = "cls.CutMix.threads"
    actual["cases"][other][0]["labels"] = "2" * goldenvalues.DIGITS
    actual["cases"][other][0]["images"] = "2" * goldenvalues.DIGITS
    del actual["cases"][other][0]["labels"]
    actual["cases"][other][0]["mix"] = "3"
    assert goldenvalues.compare(EXPECTED, actual, [other]) == [
        f"{other}: batch 0 (epoch 0, batch 0): images differ, labels missing, mix new"
    ]
    actual["cases"]["stored.cls"].pop()
    del actual["cases"]["recipe.YOLO.threads"]
    actual["cases"]["det.New.threads"] = []
    problems = goldenvalues.compare(EXPECTED, actual)
    assert "stored.cls: 8 batches, 9 recorded" in problems
    assert "recipe.YOLO.threads: recorded, not run" in problems
    assert "det.New.threads: run, not recorded" in problems
    assert len(problems) == 5


@pytest.fixture(scope="module")
def device_runs(tmp_path_factory):
    """Runs of a device case and its threads case each: a strict one (a blur), one that amplifies a
    level (HSV's integer hue), one normalised (DeiT: float images)."""
    caches = golden_caches(tmp_path_factory)
    names = ("det.GaussianBlur.device", "det.RandomHSV.device", "recipe.DeiT.device")
    names += tuple(goldenvalues.twin(n) for n in names)
    return {n: golden.run_case(n, CASES[n], caches) for n in names}


@pytest.fixture(scope="module")
def recorded(device_runs):
    """``device_runs`` as a record, made here: the tests of the comparison pass on any machine."""
    devices = [n for n in device_runs if goldenvalues.twin(n)]
    values = {
        n: goldenvalues.encode_values(device_runs[n], device_runs[goldenvalues.twin(n)]) for n in devices
    }
    return {"cases": copy.deepcopy(as_actual(device_runs)["cases"]), "values": values}


def _moved(runs: dict, name: str, batch: int, change) -> dict:
    """``compare``'s ``actual`` from ``runs``, ``name``'s images of ``batch`` given to ``change`` (its
    digest then differs)."""
    run = copy.deepcopy(runs[name])
    run.images[batch] = change(run.images[batch].copy())
    run.digests[batch] = {**run.digests[batch], "images": "moved"}
    return as_actual({**runs, name: run})


def _by_levels(count: int, step: int):
    """A change of the first ``count`` values by ``step`` levels (down where up would leave uint8)."""

    def change(values):
        flat = values.reshape(-1)[:count].astype(np.int64)
        values.reshape(-1)[:count] = np.where(flat + step > 255, flat - step, flat + step)
        return values

    return change


def test_device_images_a_level_off_agree_and_more_fail(device_runs, recorded):
    """A device case's images moved by a level (a few values: another CPU's rounding) agree; by two
    levels (one value), or a level everywhere (a changed rounding rule), they fail, named."""
    name = "det.GaussianBlur.device"
    assert goldenvalues.compare(recorded, as_actual(device_runs), [name]) == []
    size = device_runs[name].images[4].size
    most = int(goldenvalues.OFF * size)
    assert goldenvalues.compare(recorded, _moved(device_runs, name, 4, _by_levels(most, 1)), [name]) == []
    assert goldenvalues.compare(recorded, _moved(device_runs, name, 4, _by_levels(most + 1, 1)), [name]) == [
        f"{name}: batch 4 (epoch 1, batch 1): images: {most + 1} values a level off ({most} allowed)"
    ]
    assert goldenvalues.compare(recorded, _moved(device_runs, name, 4, _by_levels(size, 1)), [name]) == [
        f"{name}: batch 4 (epoch 1, batch 1): images: {size} values a level off ({most} allowed)"
    ]
    for step in (2, -2):
        moved = _moved(device_runs, name, 4, lambda v, step=step: _nudge(v, (1, 2, 3, 4), step))
        assert goldenvalues.compare(recorded, moved, [name]) == [
            f"{name}: batch 4 (epoch 1, batch 1): images: 1 values more than a level off (0 allowed; "
            "2 levels at [1, 2, 3, 4])"
        ]


def _nudge(values, at: tuple, step: int):
    """``values`` with the one at ``at`` moved by ``step`` levels (the other way where uint8 ends)."""
    v = int(values[at])
    values[at] = v + step if 0 <= v + step <= 255 else v - step
    return values


def test_a_case_that_amplifies_a_level_may_have_a_few_values_further_off(device_runs, recorded):
    """Behind HSV's integer hue, a level in may be many out: ``AMPLIFIED`` of a batch's values may be
    more than a level off there, one more fails; a case without such a step allows none."""
    name = "det.RandomHSV.device"
    assert CASES[name].amplifies() and not CASES["det.GaussianBlur.device"].amplifies()
    assert {n.split(".")[1] for n in CASES if CASES[n].amplifies() and n.startswith("det.")} == {
        "ColorJitter", "RandomHSV", "AutoAugment", "AutoAugment-cifar10", "AutoAugment-svhn", "RandAugment",
        "RandAugment-strong", "TrivialAugmentWide",
    }  # fmt: skip
    allowed = int(goldenvalues.AMPLIFIED * device_runs[name].images[0].size)
    assert goldenvalues.compare(recorded, _moved(device_runs, name, 0, _by_levels(allowed, 40)), [name]) == []
    [problem] = goldenvalues.compare(
        recorded, _moved(device_runs, name, 0, _by_levels(allowed + 1, 40)), [name]
    )
    assert problem.startswith(f"{name}: batch 0 (epoch 0, batch 0): images: {allowed + 1} values more than")
    assert f"({allowed} allowed; " in problem


def test_normalised_images_are_compared_in_levels_of_each_channel(device_runs):
    """A normalised batch goes back to levels through the cache's mean and std: the threads path's are
    whole levels; a value 0.9 of its channel's level off agrees, 1.5 does not."""
    threads, device = device_runs["recipe.DeiT.threads"], device_runs["recipe.DeiT.device"]
    std = device.stats[1]
    assert threads.images[0].dtype == np.float32 and std.shape == (3,)
    back = goldenvalues.levels(threads.images[0], threads.stats)
    assert np.abs(back - np.round(back)).max() < 1e-3 and -1e-3 < back.min() and back.max() < 255 + 1e-3
    strict = goldenvalues.Run(stats=device.stats)  # the comparison of a case that amplifies nothing
    for channel in range(3):
        for off, agrees in ((0.9, True), (-0.9, True), (1.5, False), (-1.5, False)):
            moved = device.images[0].copy()
            moved[2, channel, 5, 7] += np.float32(off / 255 / std[channel])
            note = goldenvalues.within_a_level(moved, device.images[0], strict)
            assert (note is None) == agrees, (channel, off, note)


def test_the_rest_of_a_device_batch_and_every_threads_output_stay_exact(device_runs, recorded):
    """A device case's targets, and a threads case's images moved by one bit, differ as digests; a
    device case whose threads base differs is not compared as values; a device batch of another
    memory format, or a record without values (the record as it was), fails."""
    name, base = "det.GaussianBlur.device", "det.GaussianBlur.threads"
    actual = as_actual(device_runs)
    actual["cases"][name][3] = {**actual["cases"][name][3], "targets[].boxes": "moved"}
    assert goldenvalues.compare(recorded, actual, [name]) == [
        f"{name}: batch 3 (epoch 1, batch 0): targets[].boxes differ"
    ]
    one_bit = device_runs[base].images[3].copy()
    one_bit[0, 0, 0, 0] ^= 1
    digest = goldenvalues.digest_batch((torch.from_numpy(one_bit),))["images"]
    assert digest != recorded["cases"][base][3]["images"]
    moved = as_actual(device_runs)
    moved["cases"][base][3] = {**moved["cases"][base][3], "images": digest}
    assert goldenvalues.compare(recorded, moved, [base]) == [
        f"{base}: batch 3 (epoch 1, batch 0): images differ"
    ]
    both = _moved(device_runs, name, 0, lambda v: v)
    both["cases"][base] = moved["cases"][base]
    assert goldenvalues.compare(recorded, both, [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images not compared: {base}'s differ from the record"
    ]
    last = _moved(device_runs, name, 0, lambda v: v)
    last["runs"][name].headers[0] += "channels_last|"
    assert goldenvalues.compare(recorded, last, [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images: dtype, shape or memory format unlike the record's"
        f" ({base}'s)"
    ]
    alone = _moved(device_runs, name, 0, lambda v: v)
    del alone["runs"][base]
    assert goldenvalues.compare(recorded, alone, [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images not compared: {base} not run"
    ]
    unrecorded = {**recorded, "values": {}}
    assert goldenvalues.compare(unrecorded, _moved(device_runs, name, 0, lambda v: v), [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images differ (no values recorded)"
    ]


def test_device_values_are_stored_exactly_as_a_difference_from_the_threads_case(device_runs):
    """The bits minus the threads case's give back every device value exactly, uint8 and float; a
    difference of another size fits nothing."""
    for name in ("det.GaussianBlur.device", "recipe.DeiT.device"):
        device, threads = device_runs[name], device_runs[goldenvalues.twin(name)]
        diff = goldenvalues.encode_values(device, threads)
        assert diff.dtype.kind == "u" and diff.size == sum(a.size for a in device.images)
        back = goldenvalues.decode_values(diff, threads)
        assert all(a.tobytes() == b.tobytes() and a.shape == b.shape for a, b in zip(back, device.images))
        assert goldenvalues.decode_values(diff[:-1], threads) is None
        assert goldenvalues.decode_values(np.concatenate([diff, diff[:1]]), threads) is None
    assert goldenvalues.twin("det.Mosaic.device") == "det.Mosaic.threads"
    assert goldenvalues.twin("det.Mosaic.threads") is None


def test_a_record_from_other_kernels_is_named_not_compared():
    assert goldenvalues.version_mismatch({"versions": goldenvalues.versions()}) is None
    older = {"versions": {**goldenvalues.versions(), "cv2": "4.0.0"}}
    assert (
        goldenvalues.version_mismatch(older) == f"cv2 4.0.0 recorded, {goldenvalues.versions()['cv2']} here"
    )
    assert "torch" in goldenvalues.version_mismatch({"versions": {**goldenvalues.versions(), "torch": "1.0"}})
