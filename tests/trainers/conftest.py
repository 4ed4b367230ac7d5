"""Split caches whose every sample has a class of its own, so that a batch's labels name its samples."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, build
from cachekit.tools.synthetic import synthetic_image

HERE = Path(__file__).resolve().parent
#: How many samples each split holds: sample i is alone in class i.
SPLITS = {"train": 40, "val": 16}


@pytest.fixture(scope="session")
def numbered(tmp_path_factory) -> Path:
    """``OUT/train`` (40 samples) and ``OUT/val`` (16), built from ``raw/train`` and ``raw/val`` in one
    build; the sample of class ``c{i:02d}`` has label i in both."""
    root = tmp_path_factory.mktemp("numbered")
    rng = np.random.default_rng(3)
    for split, count in SPLITS.items():
        for i in range(count):
            folder = root / "raw" / split / f"c{i:02d}"
            folder.mkdir(parents=True)
            cv2.imwrite(str(folder / "0.png"), synthetic_image(rng, 40, 48)[..., ::-1])
    build(root / "raw", root / "out", BuildConfig(size=32, shard_size=8, workers=1, progress=False))
    return root / "out"


#: What gloo or a rendezvous says when a connection between starting processes fails under load (see
#: tests/distgroup.py): the whole job is started again, from an emptied folder.
TRANSIENT = (
    "connectFullMesh",
    "Connection closed by peer",
    "Connection reset by peer",
    "Address already in use",
)
TRIES = 3


def run_job(argv: list[str], cwd: Path, launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run a job script (``python`` by default) in ``cwd``, which holds what it writes, with one OpenMP
    thread per process; started again (``TRIES`` in all) when its processes failed to connect."""
    for _ in range(TRIES):
        proc = subprocess.run(
            [*(launcher or [sys.executable]), *argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)},
        )
        if proc.returncode == 0 or not any(t in proc.stderr for t in TRANSIENT):
            break
        for left in cwd.iterdir():  # what the failed try wrote; the scripts stay
            if left.suffix != ".py":
                shutil.rmtree(left) if left.is_dir() else left.unlink()
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
