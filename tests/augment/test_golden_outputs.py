"""Golden outputs of read-time augmentation: every transform of the catalogue (alone, acting), the DeiT
and YOLO recipes, on CPU threads and on the device path run on the CPU, 3 epochs each, give the batches
of ``golden/outputs.json`` (recorded by ``benchmarks/golden.py``, which says how): bit-identical where
the code computes in integers, and within a level where the device path computes in float (its images:
another CPU rounds some values a level apart; they are compared as values, ``golden/outputs.npz``).

A change to ``cachekit/augment/`` meant to keep every output fails here with the case it changed
(``det.RandomRotation.device: batch 4 (epoch 1, batch 1): targets[].boxes differ, images: 7 values more
than a level off (0 allowed; 3 levels at [1, 0, 5, 9])``). A change meant to alter outputs regenerates
the record and says so: ``python benchmarks/golden.py --write tests/augment/golden/outputs.json``.
The device cases also run (``-m slow``) with torch's other CPU capabilities and MKL's portable code
path, as another CPU would. Bit-identity is defined only for the same kernels: with other torch, cv2 or
numpy versions than recorded, the comparisons skip.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).parent / "golden" / "outputs.json"


def _load_golden():
    spec = importlib.util.spec_from_file_location("cachekit_golden", ROOT / "benchmarks" / "golden.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


golden = _load_golden()
EXPECTED = golden.read_record(RECORD)
CASES = golden.cases()
MISMATCH = golden.version_mismatch(EXPECTED)
same_kernels = pytest.mark.skipif(
    MISMATCH is not None,
    reason=f"golden outputs were recorded with other kernels ({MISMATCH}); bit-identity is defined only "
    "for the same torch, cv2 and numpy: regenerate with benchmarks/golden.py --write to compare here",
)


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    return golden.build_caches(tmp_path_factory.mktemp("golden"))


_THREADS_RUNS: dict = {}  # a threads case's run, kept for its device case (the base of its values)


def _runs(name: str, caches) -> dict:
    """``name``'s run, and its threads case's where it is a device case."""
    runs = {name: golden.run_case(name, CASES[name], caches)}
    if golden.twin(name):
        base = golden.twin(name)
        runs[base] = _THREADS_RUNS.pop(base, None) or golden.run_case(base, CASES[base], caches)
    elif f"{name.removesuffix('.threads')}.device" in CASES:
        _THREADS_RUNS[name] = runs[name]
    return runs


def _actual(runs: dict) -> dict:
    return {"cases": {n: list(r.digests) for n, r in runs.items()}, "runs": runs}


@same_kernels
@pytest.mark.parametrize("name", list(CASES))
def test_outputs_match_the_record(name, caches):
    threads = torch.get_num_threads()
    assert golden.compare(EXPECTED, _actual(_runs(name, caches)), [name]) == []
    assert torch.get_num_threads() == threads  # run on one thread, given back


@pytest.mark.slow
@same_kernels
@pytest.mark.parametrize(
    "env",
    [{"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "default"}, {"MKL_CBWR": "COMPATIBLE"}],
    ids=["avx2", "default", "mkl-compatible"],
)
def test_the_device_path_matches_the_record_on_other_cpu_kernels(env):
    """torch's SIMD kernels for another CPU capability (read when torch loads: a new process), and MKL's
    portable code path (another CPU's MKL takes another: ``det.GaussianBlur.device``, which an Intel
    AVX512 machine rounded apart, differs here under it), round some device values a level apart: the
    record still holds, and the capability asked for is the one used where the CPU has it."""
    script = [sys.executable, str(ROOT / "benchmarks" / "golden.py"), "--check", str(RECORD)]
    script += ["--only", ".device"]
    done = subprocess.run(script, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith(f"{sum(n.endswith('.device') for n in CASES)} cases in "), summary
    wanted = env.get("ATEN_CPU_CAPABILITY", "").upper()
    if wanted == "DEFAULT" or (wanted == "AVX2" and torch.backends.cpu.get_cpu_capability() == "AVX512"):
        assert f"({wanted}):" in summary, summary


def test_the_record_holds_every_case_and_every_transform_of_the_catalogue():
    assert golden.uncovered() == []
    assert sorted(EXPECTED["cases"]) == sorted(CASES)
    assert set(EXPECTED["versions"]) == {"torch", "cv2", "numpy"}
    assert sorted(EXPECTED["values"]) == sorted(n for n in CASES if n.endswith(".device"))
    assert golden.values_path(RECORD).stat().st_size < 3_000_000  # differences from threads: mostly zeros
    per_epoch = {"cls": 3, "det": 3, "boxes": 3, "recipe": 3, "stored": 3, "layout": 3}  # 16 samples in batches of 6
    for name, batches in EXPECTED["cases"].items():
        assert len(batches) == golden.EPOCHS * per_epoch[name.split(".")[0]], name
        assert batches[2]["images"] != batches[0]["images"], name  # the last batch is short: 4 samples


def test_every_case_acts_and_differs_from_every_other():
    """No two cases give the same images (a transform that did nothing would give ``det.none``'s or
    ``stored.cls``'s), except one case on threads and on the device, where they agree exactly; the
    recorded keys are the outputs each kind of cache gives."""
    seen: dict[str, str] = {}
    for name, batches in sorted(EXPECTED["cases"].items()):
        if name.startswith("layout.") or name.endswith("-hwc"):  # the same values as another store's
            continue
        images = json.dumps([b["images"] for b in batches])
        other = seen.setdefault(images, name)
        assert other == name or other.rsplit(".", 1)[0] == name.rsplit(".", 1)[0], (other, name)
        keys = set(batches[0])
        if name.startswith(("cls.", "recipe.DeiT", "stored.cls")):
            assert keys == {"images", "labels"}, name
        elif name.startswith("recipe.YOLO"):
            assert keys == {"images", "labels"}, name  # Ultralytics' [M, 6] rows, a tensor
        elif name.startswith("det."):
            assert keys == {"images", *(f"targets[].{k}" for k in ("boxes", "classes", "iscrowd", "mask"))}
    deit = EXPECTED["cases"]["recipe.DeiT.threads"]
    assert len({b["labels"] for b in deit}) == len(deit)  # soft labels: each batch its own mix
    # epochs draw anew: epoch 1's first batch is not epoch 0's
    assert all(b[0] != b[3] for n, b in EXPECTED["cases"].items() if not n.startswith("stored")), "epochs"


def test_a_store_and_a_memory_format_change_no_value():
    """A recipe read from a ``pixels-hwc`` cache gives the default store's batches; a ``channels_last=True``
    batch the same values, channels-last (named so in its images' digest); each recipe's cases
    act (they differ from the other recipes')."""
    cases = EXPECTED["cases"]
    assert cases["stored.cls-hwc"] == cases["stored.cls"] and cases["stored.boxes-hwc"] == cases["stored.boxes"]
    for recipe in golden.LAYOUT_RECIPES:
        for path in golden.PATHS:
            got = {layout: cases[f"layout.{recipe}.{layout}.{path}"] for layout in golden.LAYOUTS}
            assert got["hwc"] == got["planes"] and got["hwc-cl"] == got["cl"], (recipe, path)
            for planes, last in zip(got["planes"], got["cl"]):
                assert planes["images"] != last["images"], (recipe, path)
                assert {k: v for k, v in planes.items() if k != "images"} == {
                    k: v for k, v in last.items() if k != "images"
                }, (recipe, path)
    for recipe in ("DeiT", "YOLO"):
        for path in golden.PATHS:
            assert cases[f"layout.{recipe}.planes.{path}"] == cases[f"recipe.{recipe}.{path}"]
    firsts = {cases[f"layout.{recipe}.planes.threads"][0]["images"] for recipe in golden.LAYOUT_RECIPES}
    assert len(firsts) == len(golden.LAYOUT_RECIPES)


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
    base = golden.digest_batch((images, targets))
    assert set(base) == {"images", "targets[].boxes", "targets[].classes"}
    assert golden.digest_batch((images.clone(), copy.deepcopy(targets))) == base
    assert len(base["images"]) == golden.DIGITS
    one = images.clone()
    one[1, 2, 5, 7] ^= 1  # the last bit of the last pixel
    flipped = golden.digest_batch((one, targets))
    assert flipped["images"] != base["images"] and flipped["targets[].boxes"] == base["targets[].boxes"]
    moved = copy.deepcopy(targets)
    moved[0]["boxes"][0, 3] = 6.5
    assert golden.digest_batch((images, moved))["targets[].boxes"] != base["targets[].boxes"]
    # a box that moves from one sample to the next, the same values in the same order: another batch
    swapped = [targets[1], targets[0]]
    assert golden.digest_batch((images, swapped))["targets[].boxes"] != base["targets[].boxes"]
    # the same bytes as another dtype or shape
    assert golden.digest_batch((images.view(2, 3, 8, 6), targets))["images"] != base["images"]
    assert golden.digest_batch((images.view(torch.int8), targets))["images"] != base["images"]
    # the same values channels-last: named so
    last = golden.digest_batch((images.contiguous(memory_format=torch.channels_last), targets))
    assert last["images"] != base["images"] and last["targets[].boxes"] == base["targets[].boxes"]
    scalar = golden.digest_batch((images, torch.tensor(0.5)))["labels"]
    assert scalar != golden.digest_batch((images, torch.tensor(0.25)))["labels"]
    assert scalar != golden.digest_batch((images, torch.tensor([0.5])))["labels"]
    labels = golden.digest_batch((images, torch.tensor([0, 1]), torch.tensor([[6, 8], [6, 8]])))
    assert set(labels) == {"images", "labels", "out2"}
    assert golden.digest_batch((images, np.array([0.5, 0.5]))) != golden.digest_batch(
        (images, np.array([0.5, 0.25]))
    )


def test_compare_names_the_case_the_batch_and_the_key():
    actual = copy.deepcopy(EXPECTED)
    assert golden.compare(EXPECTED, actual) == []
    name = "det.RandomRotation.device"
    actual["cases"][name][4]["targets[].boxes"] = "0" * golden.DIGITS
    actual["cases"][name][7]["images"] = "1" * golden.DIGITS
    assert golden.compare(EXPECTED, actual) == [
        f"{name}: batch 4 (epoch 1, batch 1): targets[].boxes differ; 1 later batches differ too"
    ]
    other = "cls.CutMix.threads"
    actual["cases"][other][0]["labels"] = "2" * golden.DIGITS
    actual["cases"][other][0]["images"] = "2" * golden.DIGITS
    del actual["cases"][other][0]["labels"]
    actual["cases"][other][0]["mix"] = "3"
    assert golden.compare(EXPECTED, actual, [other]) == [
        f"{other}: batch 0 (epoch 0, batch 0): images differ, labels missing, mix new"
    ]
    actual["cases"]["stored.cls"].pop()
    del actual["cases"]["recipe.YOLO.threads"]
    actual["cases"]["det.New.threads"] = []
    problems = golden.compare(EXPECTED, actual)
    assert "stored.cls: 8 batches, 9 recorded" in problems
    assert "recipe.YOLO.threads: recorded, not run" in problems
    assert "det.New.threads: run, not recorded" in problems
    assert len(problems) == 5


@pytest.fixture(scope="module")
def device_runs(caches):
    """Runs of a device case and its threads case each: a strict one (a blur), one that amplifies a
    level (HSV's integer hue), one normalised (DeiT: float images)."""
    names = ("det.GaussianBlur.device", "det.RandomHSV.device", "recipe.DeiT.device")
    return {n: r for name in names for n, r in _runs(name, caches).items()}


@pytest.fixture(scope="module")
def recorded(device_runs):
    """``device_runs`` as a record, made here: the tests of the comparison pass on any machine."""
    devices = [n for n in device_runs if golden.twin(n)]
    values = {n: golden.encode_values(device_runs[n], device_runs[golden.twin(n)]) for n in devices}
    return {"cases": copy.deepcopy(_actual(device_runs)["cases"]), "values": values}


def _moved(runs: dict, name: str, batch: int, change) -> dict:
    """``compare``'s ``actual`` from ``runs``, ``name``'s images of ``batch`` given to ``change`` (its
    digest then differs)."""
    run = copy.deepcopy(runs[name])
    run.images[batch] = change(run.images[batch].copy())
    run.digests[batch] = {**run.digests[batch], "images": "moved"}
    return _actual({**runs, name: run})


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
    assert golden.compare(recorded, _actual(device_runs), [name]) == []
    size = device_runs[name].images[4].size
    most = int(golden.OFF * size)
    assert golden.compare(recorded, _moved(device_runs, name, 4, _by_levels(most, 1)), [name]) == []
    assert golden.compare(recorded, _moved(device_runs, name, 4, _by_levels(most + 1, 1)), [name]) == [
        f"{name}: batch 4 (epoch 1, batch 1): images: {most + 1} values a level off ({most} allowed)"
    ]
    assert golden.compare(recorded, _moved(device_runs, name, 4, _by_levels(size, 1)), [name]) == [
        f"{name}: batch 4 (epoch 1, batch 1): images: {size} values a level off ({most} allowed)"
    ]
    for step in (2, -2):
        moved = _moved(device_runs, name, 4, lambda v, step=step: _nudge(v, (1, 2, 3, 4), step))
        assert golden.compare(recorded, moved, [name]) == [
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
    allowed = int(golden.AMPLIFIED * device_runs[name].images[0].size)
    assert golden.compare(recorded, _moved(device_runs, name, 0, _by_levels(allowed, 40)), [name]) == []
    [problem] = golden.compare(recorded, _moved(device_runs, name, 0, _by_levels(allowed + 1, 40)), [name])
    assert problem.startswith(f"{name}: batch 0 (epoch 0, batch 0): images: {allowed + 1} values more than")
    assert f"({allowed} allowed; " in problem


def test_normalised_images_are_compared_in_levels_of_each_channel(device_runs):
    """A normalised batch goes back to levels through the cache's mean and std: the threads path's are
    whole levels; a value 0.9 of its channel's level off agrees, 1.5 does not."""
    threads, device = device_runs["recipe.DeiT.threads"], device_runs["recipe.DeiT.device"]
    std = device.stats[1]
    assert threads.images[0].dtype == np.float32 and std.shape == (3,)
    back = golden.levels(threads.images[0], threads.stats)
    assert np.abs(back - np.round(back)).max() < 1e-3 and -1e-3 < back.min() and back.max() < 255 + 1e-3
    strict = golden.Run(stats=device.stats)  # the comparison of a case that amplifies nothing
    for channel in range(3):
        for off, agrees in ((0.9, True), (-0.9, True), (1.5, False), (-1.5, False)):
            moved = device.images[0].copy()
            moved[2, channel, 5, 7] += np.float32(off / 255 / std[channel])
            note = golden.within_a_level(moved, device.images[0], strict)
            assert (note is None) == agrees, (channel, off, note)


def test_the_rest_of_a_device_batch_and_every_threads_output_stay_exact(device_runs, recorded):
    """A device case's targets, and a threads case's images moved by one bit, differ as digests; a
    device case whose threads base differs is not compared as values; a device batch of another
    memory format, or a record without values (the record as it was), fails."""
    name, base = "det.GaussianBlur.device", "det.GaussianBlur.threads"
    actual = _actual(device_runs)
    actual["cases"][name][3] = {**actual["cases"][name][3], "targets[].boxes": "moved"}
    assert golden.compare(recorded, actual, [name]) == [
        f"{name}: batch 3 (epoch 1, batch 0): targets[].boxes differ"
    ]
    one_bit = device_runs[base].images[3].copy()
    one_bit[0, 0, 0, 0] ^= 1
    digest = golden.digest_batch((torch.from_numpy(one_bit),))["images"]
    assert digest != recorded["cases"][base][3]["images"]
    moved = _actual(device_runs)
    moved["cases"][base][3] = {**moved["cases"][base][3], "images": digest}
    assert golden.compare(recorded, moved, [base]) == [f"{base}: batch 3 (epoch 1, batch 0): images differ"]
    both = _moved(device_runs, name, 0, lambda v: v)
    both["cases"][base] = moved["cases"][base]
    assert golden.compare(recorded, both, [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images not compared: {base}'s differ from the record"
    ]
    last = _moved(device_runs, name, 0, lambda v: v)
    last["runs"][name].headers[0] += "channels_last|"
    assert golden.compare(recorded, last, [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images: dtype, shape or memory format unlike the record's"
        f" ({base}'s)"
    ]
    alone = _moved(device_runs, name, 0, lambda v: v)
    del alone["runs"][base]
    assert golden.compare(recorded, alone, [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images not compared: {base} not run"
    ]
    unrecorded = {**recorded, "values": {}}
    assert golden.compare(unrecorded, _moved(device_runs, name, 0, lambda v: v), [name]) == [
        f"{name}: batch 0 (epoch 0, batch 0): images differ (no values recorded)"
    ]


def test_device_values_are_stored_exactly_as_a_difference_from_the_threads_case(device_runs):
    """The bits minus the threads case's give back every device value exactly, uint8 and float; a
    difference of another size fits nothing."""
    for name in ("det.GaussianBlur.device", "recipe.DeiT.device"):
        device, threads = device_runs[name], device_runs[golden.twin(name)]
        diff = golden.encode_values(device, threads)
        assert diff.dtype.kind == "u" and diff.size == sum(a.size for a in device.images)
        back = golden.decode_values(diff, threads)
        assert all(a.tobytes() == b.tobytes() and a.shape == b.shape for a, b in zip(back, device.images))
        assert golden.decode_values(diff[:-1], threads) is None
        assert golden.decode_values(np.concatenate([diff, diff[:1]]), threads) is None
    assert golden.twin("det.Mosaic.device") == "det.Mosaic.threads"
    assert golden.twin("det.Mosaic.threads") is None


def test_a_record_from_other_kernels_is_named_not_compared():
    assert golden.version_mismatch({"versions": golden.versions()}) is None
    older = {"versions": {**golden.versions(), "cv2": "4.0.0"}}
    assert golden.version_mismatch(older) == f"cv2 4.0.0 recorded, {golden.versions()['cv2']} here"
    assert "torch" in golden.version_mismatch({"versions": {**golden.versions(), "torch": "1.0"}})


def test_the_script_checks_and_writes(tmp_path, capsys, monkeypatch, caches):
    """``--check`` prints each case that differs and exits 1; ``--write`` saves what ``--check`` reads: the
    JSON and, beside it, the device values (the same bytes for the same values), compared from there."""
    names = ("stored.cls", "cls.Resize.threads", "cls.Resize.device")
    monkeypatch.setattr(golden, "cases", lambda: {n: CASES[n] for n in names})
    monkeypatch.setattr(golden, "build_caches", lambda folder: caches)  # built once for the module
    out = tmp_path / "g.json"
    assert golden.main(["--write", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert sorted(saved["cases"]) == sorted(names) and list(saved["values"]) == ["cls.Resize.device"]
    assert saved["transforms"]["cls.Resize.threads"] == "Resize(size=(44, 60))"
    if MISMATCH is None:
        assert saved["cases"]["stored.cls"] == EXPECTED["cases"]["stored.cls"]
    assert golden.main(["--check", str(out)]) == 0
    record, values = golden.read_record(out), golden.values_path(out).read_bytes()
    golden.write_record(out, record)
    assert golden.values_path(out).read_bytes() == values and json.loads(out.read_text()) == saved
    # the device case's digest differs, its values agree: as on another CPU
    record["cases"]["cls.Resize.device"][0]["images"] = "x"
    golden.write_record(out, record)
    capsys.readouterr()
    assert golden.main(["--check", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("all agree, 1 device cases within a level")
    diff = record["values"]["cls.Resize.device"]
    diff[7:8] += np.uint8(2)  # batch 0's eighth value, two levels (modulo 256) off
    golden.write_record(out, record)
    assert golden.main(["--check", str(out)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(
        "cls.Resize.device: batch 0 (epoch 0, batch 0): images: 1 values more than a level off (0 allowed; "
    ) and printed[0].endswith(" levels at [0, 0, 0, 7])")
    diff[7:8] -= np.uint8(2)
    golden.write_record(out, record)
    saved = json.loads(out.read_text())
    saved["cases"]["cls.Resize.threads"][5]["labels"] = "x"
    out.write_text(json.dumps(saved))
    assert golden.main(["--check", str(out)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "cls.Resize.threads: batch 5 (epoch 1, batch 2): labels differ"
    assert printed[-1].startswith("3 cases in ") and printed[-1].endswith(": 1 differ")
    assert golden.main(["--check", str(out), "--only", "stored"]) == 0  # the changed case is left out
    assert capsys.readouterr().out.splitlines()[-1].startswith("1 cases in ")
    assert golden.main(["--check", str(out), "--only", "Resize.device"]) == 0  # with its threads case, unsaid
    assert capsys.readouterr().out.splitlines()[-1].startswith("1 cases in ")
    assert golden.main(["--write", str(out), "--only", "stored"]) == 2  # a record holds every case
    capsys.readouterr()
    golden.values_path(out).unlink()  # a record without its values, then one without versions, then none
    for bad in (out, out, tmp_path / "missing.json"):
        assert golden.main(["--check", str(bad)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"{bad}: not a record of golden outputs") and error.count("\n") == 1
        out.write_text('{"cases": {}}')
    assert golden.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(names)
