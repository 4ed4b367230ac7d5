"""What names a split, and what the split finders share: ``Split`` (one split of a RAW: what to build
it from), the split names (Ultralytics', Hugging Face's, torchvision's), a file's split by its name,
a folder's split folders, and the warning about images beside them.

Each layout's finder is its own module, named by its row of ``layouts.LAYOUTS`` (``Layout.splits``):
``yolosplits`` (a data.yaml), ``vocsplits`` (ImageSets lists), ``recordsplits`` (files named by split),
``foldersplits`` (``train/`` ``val/`` folders). Each has ``find_splits(request, row)``.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...constants import IMAGE_EXTENSIONS
from ...errors import UsageError

__all__ = ["SPLIT_NAMES", "Split", "split_of_name", "ordered", "split_folders", "warn_loose"]

#: Folder and file names that name a split (Ultralytics', Hugging Face's, torchvision's).
SPLIT_NAMES = ("train", "val", "valid", "validation", "test")
_NAME_HEAD = re.compile(r"^([A-Za-z]+)(?:[-_.].*)?$")
#: Loose images named in the warning about them (the count names them all).
_SHOWN = 3


@dataclass(frozen=True)
class Split:
    """One split of a RAW: what to build it from.

    ``raw``: a folder, or a pattern of Parquet or tar files naming exactly this split's files.
    ``annotations``: YOLO's data.yaml (its class names for every split). ``only``: paths under
    ``raw`` (files or folders, relative to it) that are this split's inputs, when a data.yaml lists
    them; ``missing``: ``(entry, reason)`` for listed images that are not under ``raw``.
    """

    name: str
    raw: str
    annotations: str | None = None
    only: tuple[str, ...] | None = None
    missing: tuple[tuple[str, str], ...] = ()
    origin: str = ""  # what named it (data.yaml, file names, folders), for messages


def split_of_name(name: str) -> str | None:
    """The split a file of records belongs to by its relative name: a folder named as a split
    (``train/0001.parquet``, the innermost), else a file name starting with one and ``-``, ``_`` or
    ``.`` (``train-00000-of-00002.parquet``, ``test.parquet``); None when neither."""
    parts = PurePosixPath(name).parts
    for part in reversed(parts[:-1]):
        if part.lower() in SPLIT_NAMES:
            return part.lower()
    m = _NAME_HEAD.match(parts[-1]) if parts else None
    if m and m.group(1).lower() in SPLIT_NAMES:
        return m.group(1).lower()
    return None


def ordered(splits: dict[str, Split]) -> dict[str, Split] | None:
    if not splits:
        return None
    rank = {n: i for i, n in enumerate(SPLIT_NAMES)}
    return {n: splits[n] for n in sorted(splits, key=lambda n: rank.get(n, len(rank)))}


def _subfolders(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def split_folders(root: Path) -> dict[str, str] | None:
    """The folders of ``root`` by the split each names, in any case as Parquet names are (``Train/``
    is ``train``), when every one names one; None otherwise. Two naming one split are one line."""
    names = _subfolders(root)
    if not names or any(n.lower() not in SPLIT_NAMES for n in names):
        return None
    out: dict[str, str] = {}
    for name in names:
        if name.lower() in out:
            raise UsageError(
                f"{root}: the folders {out[name.lower()]} and {name} both name the split {name.lower()}: "
                "rename or remove one"
            )
        out[name.lower()] = name
    return out


def warn_loose(root: Path, splits: list[str]) -> None:
    """One warning naming the images directly in ``root`` beside its split folders: they are in no
    split, so no split's cache holds them (never dropped silently)."""
    try:
        loose = sorted(
            e.name
            for e in os.scandir(root)
            if not e.name.startswith(".") and e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS)
        )
    except OSError:
        return
    if loose:
        shown = ", ".join(loose[:_SHOWN])
        warnings.warn(
            f"{len(loose)} images directly in {root} are in no split (its folders {', '.join(splits)} are "
            f"the splits) and are left out: {shown}{' ...' if len(loose) > _SHOWN else ''}",
            UserWarning,
            stacklevel=2,
        )
