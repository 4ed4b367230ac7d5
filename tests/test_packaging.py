"""The distribution: a wheel builds without deprecation warnings, under its own name, with the recipes."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cachekit.constants import DIST_NAME
from cachekit.image.recipes import builtin_pipelines

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_builds_cleanly_under_its_own_name(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("needs setuptools >= 77 (SPDX license expressions) to build without isolation")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("cachekit", "pipelines"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", str(src)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "deprecat" not in log.lower(), [line for line in log.splitlines() if "eprecat" in line]
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = email.message_from_bytes(zf.read(next(n for n in names if n.endswith("/METADATA"))))
        entry_points = zf.read(next(n for n in names if n.endswith("/entry_points.txt"))).decode()
    assert meta["Name"] == DIST_NAME and meta["License-Expression"] == "Apache-2.0"
    assert any(n.endswith("/licenses/LICENSE") for n in names)
    assert "cachekit = cachekit.cli:main" in entry_points
    for recipe in builtin_pipelines():
        assert f"cachekit/pipelines/{recipe}.toml" in names
