"""Splits named by folders (the rule ``layouts.FOLDER_SPLITS``): a local folder whose folders are all
split names (``train/``, ``val/``, in any case: ``Train/`` is ``train``), an ImageFolder tree each, or
a folder of Parquet or tar files each; or Parquet or tar files named by split directly in the folder
or in its ``data/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .layouts import LAYOUTS, Layout, Request, record_suffixes
from .recordsplits import record_splits
from .splitnames import Split, ordered, split_folders, warn_loose

__all__ = ["find_splits"]


def find_splits(request: Request, row: Layout) -> dict[str, Split] | None:
    """The splits a local folder names: its files of records named by split (in it or in ``data/``),
    else its split folders; None for a URL or a folder that names none."""
    if not request.local_dir:
        return None
    root = Path(request.text)
    for folder in (root, root / "data"):
        for kind in [r for r in LAYOUTS if r.suffix is not None]:
            if folder.is_dir() and any(
                e.is_file() and e.name.lower().endswith(kind.suffix) for e in os.scandir(folder)
            ):
                return record_splits(
                    str(folder / f"*{kind.suffix}"), request.storage_options, 1, kind.files_noun
                )
    return _folder_splits(root)


def _folder_splits(root: Path) -> dict[str, Split] | None:
    """``root/<split>/`` folders, when every folder of ``root`` is named as a split."""
    found = split_folders(root)
    if found is None:
        return None
    out = {}
    for name, folder_name in found.items():
        folder = root / folder_name
        raw = str(folder)
        for suffix in record_suffixes():
            if any(e.is_file() and e.name.lower().endswith(suffix) for e in os.scandir(folder)):
                raw = str(folder / f"*{suffix}")
                break
        out[name] = Split(name, raw, origin=f"the folders of {root}")
    warn_loose(root, list(found.values()))
    return ordered(out)
