"""The benchmark registry: suites by name, and the synthetic data they share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from cachekit.tools.synthetic import make_synthetic_folder

__all__ = ["SUITES", "suite", "synthetic_raw"]

SUITES: dict[str, Callable[[argparse.Namespace, Path], dict]] = {}


def suite(fn):
    """Register ``fn(args, root) -> figures`` under its name."""
    SUITES[fn.__name__] = fn
    return fn


def synthetic_raw(
    args, root: Path, n: int | None = None, size=(375, 500), name="raw", classes: int = 10
) -> Path:
    """``n`` (default ``--images``) ImageNet-like JPEGs in ``classes`` folders, made once per work folder."""
    n = n or args.images
    raw = root / f"{name}-{n}-{size[0]}x{size[1]}-{classes}"
    if not raw.is_dir():
        make_synthetic_folder(raw, n, classes=classes, size=size)
    return raw
