"""Splits named by files of records (the rule ``layouts.FILE_SPLITS``): Parquet or tar files whose
names or folders start with a split name, Hugging Face's ``data/train-00000-of-00002.parquet``,
``data/test-*.parquet``, ``train/*.parquet`` or WebDataset's ``train-000000.tar``; each split's files
named by a pattern of their own.

A pattern that names one split only (``data/train-*.parquet``) is that split's files: it builds one
cache, as any pattern does.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from ...errors import UsageError
from .layouts import Layout, Request
from .recordfiles import find_files, pattern_folder
from .splitnames import Split, ordered, split_of_name

__all__ = ["find_splits", "record_splits"]

_PATTERN_CHARS = set("*?[]{},")


def find_splits(request: Request, row: Layout) -> dict[str, Split] | None:
    """The splits the files of records ``request`` names (two at least); None for a local folder or
    with ``--annotations``."""
    if request.local_dir or request.annotations is not None:
        return None
    return record_splits(request.text, request.storage_options, 2, row.files_noun)


def record_splits(
    pattern: str, storage_options, need: int, files_noun: str | None
) -> dict[str, Split] | None:
    """The files ``pattern`` names (``files_noun``: what they are called in messages) grouped by
    ``split_of_name``; None when fewer than ``need`` splits are named. Files of no split beside files
    of splits are one line (they would go nowhere)."""
    files = find_files(pattern, storage_options, files_noun)
    groups: dict[str, list] = {}
    for f in files:
        groups.setdefault(split_of_name(f.name) or "", []).append(f)
    named = {k: v for k, v in groups.items() if k}
    if len(named) < need:
        return None
    if "" in groups:
        stray = groups[""]
        raise UsageError(
            f"{pattern}: files of the splits {', '.join(sorted(named))} and {len(stray)} of no split "
            f"(e.g. {stray[0].name}); name each split's files in the file or folder name"
        )
    base = pattern_folder(pattern)
    out = {}
    for name, group in named.items():
        out[name] = Split(name, _pattern_of(base, [f.name for f in group], name, pattern, storage_options),
                          origin=f"the file names of {pattern}")  # fmt: skip
    return ordered(out)


def _pattern_of(base: str, names: list[str], split: str, pattern: str, storage_options) -> str:
    """A pattern naming exactly ``names`` (relative to ``base``), kept relative to the same folder:
    ``base/train-*.parquet`` when that glob finds them all and no other, else a brace list
    (``base/{x/train-0,y/train-1}.parquet``)."""
    join = (lambda rel: f"{base}/{rel}") if base else (lambda rel: rel)
    if len(names) == 1 and not _PATTERN_CHARS & set(names[0]):
        return join(names[0])
    suffix = PurePosixPath(names[0]).suffix
    folders = {str(PurePosixPath(n).parent) for n in names}
    if len(folders) == 1:
        folder = folders.pop()
        prefix = "" if folder == "." else f"{folder}/"
        for candidate in (f"{prefix}{split}-*{suffix}", f"{prefix}{split}_*{suffix}", f"{prefix}*{suffix}"):
            if candidate.endswith(f"/*{suffix}") and PurePosixPath(folder).name.lower() != split:
                continue
            try:
                # the candidate's names are relative to its own folder (base/prefix), ``names`` to base
                got = {f"{prefix}{f.name}" for f in find_files(join(candidate), storage_options, "")}
            except UsageError:
                continue
            if got == set(names):
                return join(candidate)
    if any(_PATTERN_CHARS & set(n) for n in names):
        raise UsageError(
            f"{pattern}: the files of split {split} cannot be named apart (a name holds one of "
            f"{''.join(sorted(_PATTERN_CHARS))}); give each split's files as their own pattern"
        )
    stems = [n[: len(n) - len(suffix)] for n in names]  # the suffix after the braces says the kind
    return join("{" + ",".join(stems) + "}" + suffix)
