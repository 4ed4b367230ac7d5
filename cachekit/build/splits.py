"""A dataset's splits, found before its inputs: a RAW that names splits builds one cache per split.

What names splits is the rule of RAW's layout (``Layout.splits`` of its row in ``sources.layouts``),
each a module of its own under ``sources/`` with ``find_splits(request, row)``: ``yolosplits`` (a YOLO
``data.yaml``'s ``train``/``val``/``test``, or ``images/<split>/``), ``vocsplits`` (a VOC tree's
``ImageSets/Main`` lists), ``recordsplits`` (Parquet or tar files named by split, Hugging Face's
``data/train-*.parquet``) and ``foldersplits`` (``train/`` ``val/`` folders, in any case). Nothing
else names splits (a labels CSV or a COCO file says which files are inputs); the names themselves
and ``Split`` are ``sources.splitnames``'.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..store.remote import is_url
from .sources.layouts import Layout, Request, detect
from .sources.splitnames import Split

__all__ = ["find_splits", "pick_splits", "split_out"]


def split_out(out, name: str) -> str:
    """Where split ``name`` of a build into ``out`` goes: ``out/name`` (a folder or a URL)."""
    text = os.fspath(out)
    return f"{text.rstrip('/')}/{name}" if is_url(text) else os.path.join(text, name)


def pick_splits(found: dict[str, Split], wanted, raw) -> dict[str, Split]:
    """The splits ``wanted`` names (``"train,val"`` or a list; None: all), in ``found``'s order; a
    name not found is one line listing those that are."""
    if wanted is None:
        return dict(found)
    if not isinstance(wanted, (str, list, tuple)) or not all(isinstance(n, str) for n in wanted):
        raise UsageError(f"split={wanted!r}: give split names, 'train,val' or ['train', 'val']")
    names = [n.strip() for n in (wanted.split(",") if isinstance(wanted, str) else wanted)]
    names = [n for n in names if n]
    if not names:
        raise UsageError("--split names no split (give NAME[,NAME...])")
    unknown = [n for n in names if n not in found]
    if unknown:
        raise UsageError(
            f"--split {','.join(unknown)}: {raw} holds the splits {', '.join(found)} "
            f"(named by {next(iter(found.values())).origin})"
        )
    return {n: s for n, s in found.items() if n in names}


def find_splits(
    raw, annotations=None, labels=None, storage_options=None, *, row: Layout | None = None
) -> dict[str, Split] | None:
    """The splits ``raw`` names, by name in the order found (``train`` first), or None when it names
    none. ``annotations`` and ``labels`` are the build's ``--annotations`` and ``--labels``; ``row``
    is RAW's layout when the caller detected it already (a build detects it once)."""
    if not isinstance(raw, (str, os.PathLike)):
        return None
    if labels is not None:
        return None
    request = Request(raw, annotations=annotations, storage_options=storage_options)
    row = row if row is not None else detect(Request(raw, annotations=annotations))
    finder = row.split_finder() if row is not None else None
    return finder.find_splits(request, row) if finder is not None else None
