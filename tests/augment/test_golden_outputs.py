"""Golden outputs of read-time augmentation: every transform of the catalogue (alone, acting), the DeiT
and YOLO recipes, on CPU threads and on the device path run on the CPU, 3 epochs each, give batches
bit-identical to ``golden/outputs.json`` (recorded by ``benchmarks/golden.py``, which says how).

A change to ``cachekit/augment/`` meant to keep every output fails here with the case it changed
(``det.RandomRotation.device: batch 4 (epoch 1, batch 1): images, targets[].boxes differ``). A change
meant to alter outputs regenerates the record and says so:
``python benchmarks/golden.py --write tests/augment/golden/outputs.json``. Bit-identity is defined only
for the same kernels: with other torch, cv2 or numpy versions than recorded, the comparisons skip.
"""

from __future__ import annotations

import copy
import importlib.util
import json
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
EXPECTED = json.loads(RECORD.read_text())
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


@same_kernels
@pytest.mark.parametrize("name", list(CASES))
def test_outputs_are_bit_identical_to_the_record(name, caches):
    threads = torch.get_num_threads()
    actual = {"cases": {name: golden.run_case(name, CASES[name], caches)}}
    assert golden.compare(EXPECTED, actual, [name]) == []
    assert torch.get_num_threads() == threads  # run on one thread, given back


def test_the_record_holds_every_case_and_every_transform_of_the_catalogue():
    assert golden.uncovered() == []
    assert sorted(EXPECTED["cases"]) == sorted(CASES)
    assert set(EXPECTED["versions"]) == {"torch", "cv2", "numpy"}
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


def test_a_record_from_other_kernels_is_named_not_compared():
    assert golden.version_mismatch({"versions": golden.versions()}) is None
    older = {"versions": {**golden.versions(), "cv2": "4.0.0"}}
    assert golden.version_mismatch(older) == f"cv2 4.0.0 recorded, {golden.versions()['cv2']} here"
    assert "torch" in golden.version_mismatch({"versions": {**golden.versions(), "torch": "1.0"}})


def test_the_script_checks_and_writes(tmp_path, capsys, monkeypatch):
    """``--check`` prints each case that differs and exits 1; ``--write`` saves what ``--check`` reads."""
    monkeypatch.setattr(golden, "cases", lambda: {n: CASES[n] for n in ("stored.cls", "cls.Resize.threads")})
    out = tmp_path / "g.json"
    assert golden.main(["--write", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert sorted(saved["cases"]) == ["cls.Resize.threads", "stored.cls"]
    assert saved["transforms"]["cls.Resize.threads"] == "Resize(size=(44, 60))"
    if MISMATCH is None:
        assert saved["cases"]["stored.cls"] == EXPECTED["cases"]["stored.cls"]
    assert golden.main(["--check", str(out)]) == 0
    saved["cases"]["cls.Resize.threads"][5]["labels"] = "x"
    out.write_text(json.dumps(saved))
    capsys.readouterr()
    assert golden.main(["--check", str(out)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "cls.Resize.threads: batch 5 (epoch 1, batch 2): labels differ"
    assert printed[-1].startswith("2 cases in ") and printed[-1].endswith(": 1 differ")
    assert golden.main(["--check", str(out), "--only", "stored"]) == 0  # the changed case is left out
    assert capsys.readouterr().out.splitlines()[-1].startswith("1 cases in ")
    assert golden.main(["--write", str(out), "--only", "stored"]) == 2  # a record holds every case
    capsys.readouterr()
    for bad in (tmp_path / "missing.json", tmp_path / "g.json"):
        if bad.exists():
            bad.write_text('{"cases": {}}')  # no versions
        assert golden.main(["--check", str(bad)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"{bad}: not a record of golden outputs") and error.count("\n") == 1
    assert golden.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == ["stored.cls", "cls.Resize.threads"]
