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
numpy versions than recorded, the comparisons skip. The record itself (what it holds, every case
acting) and the script's ``--write`` and ``--check`` are tested here; the digests and the comparison,
in ``test_golden_compare.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from goldenkit import CASES, EXPECTED, MISMATCH, RECORD, ROOT, as_actual, golden, golden_caches, goldenvalues

same_kernels = pytest.mark.skipif(
    MISMATCH is not None,
    reason=f"golden outputs were recorded with other kernels ({MISMATCH}); bit-identity is defined only "
    "for the same torch, cv2 and numpy: regenerate with benchmarks/golden.py --write to compare here",
)

_THREADS_RUNS: dict = {}  # a threads case's run, kept for its device case (the base of its values)


def _runs(name: str, caches) -> dict:
    """``name``'s run, and its threads case's where it is a device case."""
    runs = {name: golden.run_case(name, CASES[name], caches)}
    if goldenvalues.twin(name):
        base = goldenvalues.twin(name)
        runs[base] = _THREADS_RUNS.pop(base, None) or golden.run_case(base, CASES[base], caches)
    elif f"{name.removesuffix('.threads')}.device" in CASES:
        _THREADS_RUNS[name] = runs[name]
    return runs


@same_kernels
@pytest.mark.parametrize("name", list(CASES))
def test_outputs_match_the_record(name, tmp_path_factory):
    threads = torch.get_num_threads()
    runs = _runs(name, golden_caches(tmp_path_factory))
    assert goldenvalues.compare(EXPECTED, as_actual(runs), [name]) == []
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
    assert goldenvalues.values_path(RECORD).stat().st_size < 3_000_000  # differences from threads, mostly 0
    per_epoch = {"cls": 3, "det": 3, "boxes": 3, "recipe": 3, "stored": 3, "layout": 3}  # 16 samples in batches of 6
    for name, batches in EXPECTED["cases"].items():
        assert len(batches) == goldenvalues.EPOCHS * per_epoch[name.split(".")[0]], name
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


def test_the_script_checks_and_writes(tmp_path, capsys, monkeypatch, tmp_path_factory):
    """``--check`` prints each case that differs and exits 1; ``--write`` saves what ``--check`` reads: the
    JSON and, beside it, the device values (the same bytes for the same values), compared from there."""
    names = ("stored.cls", "cls.Resize.threads", "cls.Resize.device")
    monkeypatch.setattr(golden, "cases", lambda: {n: CASES[n] for n in names})
    caches = golden_caches(tmp_path_factory)
    monkeypatch.setattr(golden, "build_caches", lambda folder: caches)  # built once for the session
    out = tmp_path / "g.json"
    assert golden.main(["--write", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert sorted(saved["cases"]) == sorted(names) and list(saved["values"]) == ["cls.Resize.device"]
    assert saved["transforms"]["cls.Resize.threads"] == "Resize(size=(44, 60))"
    if MISMATCH is None:
        assert saved["cases"]["stored.cls"] == EXPECTED["cases"]["stored.cls"]
    assert golden.main(["--check", str(out)]) == 0
    record, values = goldenvalues.read_record(out), goldenvalues.values_path(out).read_bytes()
    goldenvalues.write_record(out, record)
    assert goldenvalues.values_path(out).read_bytes() == values and json.loads(out.read_text()) == saved
    # the device case's digest differs, its values agree: as on another CPU
    record["cases"]["cls.Resize.device"][0]["images"] = "x"
    goldenvalues.write_record(out, record)
    capsys.readouterr()
    assert golden.main(["--check", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("all agree, 1 device cases within a level")
    diff = record["values"]["cls.Resize.device"]
    diff[7:8] += np.uint8(2)  # batch 0's eighth value, two levels (modulo 256) off
    goldenvalues.write_record(out, record)
    assert golden.main(["--check", str(out)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(
        "cls.Resize.device: batch 0 (epoch 0, batch 0): images: 1 values more than a level off (0 allowed; "
    ) and printed[0].endswith(" levels at [0, 0, 0, 7])")
    diff[7:8] -= np.uint8(2)
    goldenvalues.write_record(out, record)
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
    goldenvalues.values_path(out).unlink()  # a record without its values, one without versions, none
    for bad in (out, out, tmp_path / "missing.json"):
        assert golden.main(["--check", str(bad)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"{bad}: not a record of golden outputs") and error.count("\n") == 1
        out.write_text('{"cases": {}}')
    assert golden.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(names)
