"""What the golden-output tests share: ``benchmarks/golden.py`` (loaded by its path) and
``goldenvalues.py`` beside it, the record they check, its cases, and the caches those read.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).parent / "golden" / "outputs.json"


def _load_golden():
    spec = importlib.util.spec_from_file_location("cachekit_golden", ROOT / "benchmarks" / "golden.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


golden = _load_golden()
goldenvalues = importlib.import_module("goldenvalues")  # beside golden.py, which put its folder on sys.path
EXPECTED = goldenvalues.read_record(RECORD)
CASES = golden.cases()
MISMATCH = goldenvalues.version_mismatch(EXPECTED)

_CACHES: dict[str, Path] = {}


def golden_caches(factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The caches the cases read (``golden.build_caches``), built once a session under ``factory``."""
    if not _CACHES:
        _CACHES.update(golden.build_caches(factory.mktemp("golden")))
    return _CACHES


def as_actual(runs: dict) -> dict:
    """``compare``'s ``actual`` from runs by case name: their digests, and the runs (their images)."""
    return {"cases": {n: list(r.digests) for n, r in runs.items()}, "runs": runs}
