"""The distribution: sdist and wheel build cleanly under their own name and carry every module,
the recipes and ``py.typed``; the wheel built from the sdist is the same (nothing left behind)."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from cachekit.constants import DIST_NAME, VERSION

ROOT = Path(__file__).resolve().parents[1]


def _checkout_files() -> list[str]:
    """The files a clean clone has (git's list; a plain copy's files where there is no .git)."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def _package_files(files: list[str]) -> set[str]:
    """What the wheel must hold: every file under cachekit/ (modules, py.typed) and the top-level
    pipelines/ recipes, which the wheel carries as cachekit/pipelines/."""
    package = {f for f in files if f.startswith("cachekit/") and not f.endswith(".pyc")}
    recipes = {f"cachekit/{f}" for f in files if f.startswith("pipelines/") and f.endswith(".toml")}
    return package | recipes


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    pytest.importorskip("build")
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("needs setuptools >= 77 (SPDX license expressions) to build without isolation")
    tmp = tmp_path_factory.mktemp("dist")
    src, out = tmp / "src", tmp / "out"
    files = _checkout_files()
    for rel in files:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    # no flags: the sdist first, then the wheel built from the unpacked sdist
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "deprecat" not in log.lower(), [line for line in log.splitlines() if "eprecat" in line]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist, files


@pytest.mark.slow
def test_the_wheel_carries_every_module_recipe_and_marker_under_its_own_name(dists):
    wheel, _, files = dists
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = email.message_from_bytes(zf.read(next(n for n in names if n.endswith("/METADATA"))))
        entry_points = zf.read(next(n for n in names if n.endswith("/entry_points.txt"))).decode()
    want = _package_files(files)
    assert {"cachekit/cli/__init__.py", "cachekit/__main__.py", "cachekit/py.typed"} <= want
    assert any(f.startswith("cachekit/pipelines/") and f.endswith(".toml") for f in want)
    assert want - names == set(), "left out of the wheel"
    assert {n for n in names if n.startswith("cachekit/")} - want == set(), "in the wheel, not in git"
    assert meta["Name"] == DIST_NAME and meta["Version"] == VERSION
    assert meta["License-Expression"] == "Apache-2.0"
    assert any(n.endswith("/licenses/LICENSE") for n in names)
    assert "cachekit = cachekit.cli:main" in entry_points


@pytest.mark.slow
def test_the_sdist_carries_the_package_and_what_builds_it(dists):
    _, sdist, files = dists
    with tarfile.open(sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert top == f"{DIST_NAME.replace('-', '_')}-{VERSION}"
    assert {f for f in _package_files(files) if not f.startswith("cachekit/pipelines/")} - names == set()
    assert {f for f in files if f.startswith("pipelines/")} - names == set(), "recipes left out"
    assert {"pyproject.toml", "setup.py", "README.md", "LICENSE"} <= names


def test_the_recipes_sit_at_the_top_level_and_nowhere_else():
    files = _checkout_files()
    assert any(f.startswith("pipelines/") and f.endswith(".toml") for f in files)
    assert not any(f.startswith("cachekit/pipelines/") for f in files), "one home for the recipes"


def test_python_dash_m_cachekit_is_the_command():
    proc = subprocess.run(
        [sys.executable, "-m", "cachekit", "--help"], capture_output=True, text=True, cwd="/"
    )
    assert proc.returncode == 0 and "Usage: python -m cachekit" in proc.stdout, proc.stderr
    assert "build" in proc.stdout and "verify" in proc.stdout
