"""The examples run as written, in one process and under torchrun, on caches of both training recipes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachekit import BuildConfig, build

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: Runs an example and fails it if a gloo thread outlives it (which aborts the process at exit now and then).
RUN = str(Path(__file__).resolve().with_name("run_example.py"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]  # fmt: skip
#: Each recipe at a size these tests can train on in seconds; the examples crop 32x32 from it.
RECIPES = {"train-256": 40, "classification-224": 36}


@pytest.fixture(scope="module", params=sorted(RECIPES))
def caches(request, learnable_tree, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param) / "cache"
    build(learnable_tree, out, BuildConfig(pipeline=request.param, size=RECIPES[request.param], workers=1,
                                           progress=False))  # fmt: skip
    return request.param, out


def _run(argv: list[str], launcher: list[str]) -> str:
    proc = subprocess.run(
        [*launcher, RUN, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _launchers(recipe: str) -> list[list[str]]:
    """One process always; torchrun on the recipe README recommends (each run costs ~10 s)."""
    return [[sys.executable], TORCHRUN] if recipe == "train-256" else [[sys.executable]]


@pytest.mark.slow
def test_train_ddp_learns_on_either_recipe_in_one_process_and_under_torchrun(caches):
    recipe, cache = caches
    for launcher in _launchers(recipe):
        out = _run([str(EXAMPLES / "train_ddp.py"), str(cache), "--steps", "40", "--batch-size", "8",
                    "--lr", "0.02", "--crop", "32"], launcher)  # fmt: skip
        assert f"world {2 if launcher is TORCHRUN else 1}, 48 samples" in out, out
        done = [line for line in out.splitlines() if line.startswith("done:")]
        first, last = (float(v) for v in done[0].split("loss")[1].split("->"))
        assert last < first * 0.9, out


@pytest.mark.slow
def test_train_evaluates_every_epoch_on_either_recipe_in_one_process_and_under_torchrun(caches):
    recipe, cache = caches
    for launcher in _launchers(recipe):
        out = _run([str(EXAMPLES / "train.py"), str(cache), str(cache), "--epochs", "2", "--batch-size", "8",
                    "--crop", "32"], launcher)  # fmt: skip
        epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
        assert [line.split(":")[0] for line in epochs] == ["epoch 0", "epoch 1"], out
        correct, seen = (int(v) for v in epochs[-1].split("accuracy ")[1].split("/"))
        assert seen == 48 and 0 <= correct <= seen, out


@pytest.fixture(scope="module")
def detection_cache(tmp_path_factory) -> Path:
    from cachekit.tools.synthetic_objects import make_object_dataset

    raw = make_object_dataset(tmp_path_factory.mktemp("detection") / "raw", 24, size=(96, 128), classes=3)
    out = raw.parent / "cache"
    build(
        raw,
        out,
        BuildConfig(annotations="yolo", pipeline="letterbox-640", size=128, workers=1, progress=False),
    )
    return out


@pytest.mark.slow
def test_train_detection_learns_in_one_process_and_under_torchrun(detection_cache):
    for launcher in ([sys.executable], TORCHRUN):
        out = _run([str(EXAMPLES / "train_detection.py"), str(detection_cache), "--steps", "40", "--batch-size", "4",
                    "--size", "96"], launcher)  # fmt: skip
        assert f"world {2 if launcher is TORCHRUN else 1}, 24 images, 3 classes" in out, out
        done = [line for line in out.splitlines() if line.startswith("done:")]
        first, last = (float(v) for v in done[0].split("loss")[1].split("->"))
        assert last < first * 0.7, out


@pytest.mark.slow
def test_train_yolo_closes_mosaic_for_its_last_epochs_and_learns(tmp_path):
    grid = tmp_path / "batch0.png"
    out = _run([str(EXAMPLES / "train_yolo.py"), "--synthetic", "24", "--epochs", "4", "--close-mosaic", "1",
                "--batch-size", "4", "--size", "96", "--preview", str(grid)], [sys.executable])  # fmt: skip
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    plans = [line.split(":")[1].split(",")[0].strip() for line in epochs]
    tail = "RandomAffine + RandomHSV + RandomHorizontalFlip"  # the whole plan, colour included
    assert plans == [f"Mosaic + {tail}"] * 3 + [f"Letterbox + {tail}"], out
    done = [line for line in out.splitlines() if line.startswith("done:")]
    first, last = (float(v) for v in done[0].split("loss")[1].split("->"))
    assert last < first, out
    assert grid.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_yolos_recipe_is_ultralytics_defaults_grey_borders_included():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from train_yolo import recipes
    finally:
        sys.path.remove(str(EXAMPLES))
    for plan in recipes(96):
        (affine,) = [t for t in plan if type(t).__name__ == "RandomAffine"]
        assert affine.fill == 114 and affine.translate == (0.1, 0.1) and affine.scale == (0.5, 1.5)
        assert [type(t).__name__ for t in plan][1:] == ["RandomAffine", "RandomHSV", "RandomHorizontalFlip"]
