"""A folder of split caches: what a build of a RAW that names splits writes (``OUT/train``,
``OUT/val``, each a cache of its own). The folder itself has no manifest; readers, ``verify`` and
``info`` name its splits, and ``split=`` opens one."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..constants import MANIFEST_NAME
from ..errors import NotACacheError, UsageError
from .remote import is_url

__all__ = ["cache_splits", "check_split_out", "choose_split", "split_path", "splits_error"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def cache_splits(path: str | os.PathLike) -> tuple[str, ...]:
    """The splits a local folder holds, sorted: its sub-folders with a manifest, when it has none
    itself; () for a cache, a URL, or a folder of no split caches."""
    if is_url(os.fspath(path)):
        return ()
    root = Path(path)
    if not root.is_dir() or os.path.lexists(root / MANIFEST_NAME):
        return ()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return ()
    return tuple(
        sorted(
            e.name
            for e in entries
            if _NAME.match(e.name)
            and _own_folder(e.path)
            and os.path.isfile(os.path.join(e.path, MANIFEST_NAME))
        )
    )


def _own_folder(path: str) -> bool:
    """Whether ``path`` is a split's own folder, the only kind readers open: a folder, not a link to one
    (which could send a split's files anywhere)."""
    return not os.path.islink(path) and os.path.isdir(path)


def check_split_out(path: str | os.PathLike) -> None:
    """Refuse, in one line, to build a split into ``path`` (``OUT/<split>``, local) when it is there
    but not a folder of its own: a symbolic link would send the split's files outside OUT, and the
    readers (``cache_splits``) would not open them."""
    text = os.fspath(path)
    if not is_url(text) and os.path.lexists(text) and not _own_folder(text):
        what = "a symbolic link" if os.path.islink(text) else "not a folder"
        raise UsageError(
            f"{text} is {what}: a split's cache is written into a folder of its own, as readers open it; "
            "remove it or give another --out"
        )


def split_path(path: str | os.PathLike, split: str) -> str:
    """The cache of split ``split`` in the folder of split caches ``path`` (a folder or a URL); a
    name that is not a plain folder name, or (locally) not one of the folder's splits, is one line."""
    text = os.fspath(path)
    if not isinstance(split, str) or not _NAME.match(split):
        raise UsageError(f"split={split!r}: a split is a plain folder name such as 'train'")
    if is_url(text):
        return f"{text.rstrip('/')}/{split}"
    found = cache_splits(text)
    if split not in found:
        if os.path.lexists(Path(text) / MANIFEST_NAME):
            raise UsageError(f"{text} is one cache, not a folder of splits: open it without split=")
        held = f"holds the splits {', '.join(found)}" if found else "holds no split caches"
        raise NotACacheError(f"{text}: no split {split!r} ({held})")
    return os.path.join(text, split)


def splits_error(path: str | os.PathLike, opener: str = "CachedDataset") -> NotACacheError | None:
    """The one line for a folder of split caches opened as a cache, naming its splits and how to
    open one (``CachedDataset("OUT", split="train")``); None when ``path`` is not such a folder."""
    found = cache_splits(path)
    if not found:
        return None
    return NotACacheError(
        f"{os.fspath(path)} holds splits {', '.join(found)}, each a cache: "
        f'{opener}("{os.fspath(path)}", split="{found[0]}")'
    )


def choose_split(
    path: str | os.PathLike, split: str | None = None, *, default: str | None = "train"
) -> tuple[str, str | None]:
    """The cache a command given ``path`` and ``--split`` works on, and the line saying which split
    it chose when the user named none.

    ``split``: that split of a folder of split caches (a cache given ``--split`` is one line).
    Without it, a cache (or a URL) is itself; a folder of split caches is its ``default`` split when
    it holds one (and the line says so), else one line naming its splits and ``--split``."""
    text = os.fspath(path)
    if split is not None:
        if not is_url(text) and os.path.lexists(Path(text) / MANIFEST_NAME):
            raise UsageError(
                f"--split {split}: {text} is one cache, not a folder of splits: leave out --split"
            )
        return split_path(text, split), None
    found = cache_splits(text)
    if not found:
        return text, None
    if default is not None and default in found:
        return (
            os.path.join(text, default),
            f"{text} holds splits {', '.join(found)}: using {default} (--split NAME for another)",
        )
    raise UsageError(f"{text} holds splits {', '.join(found)}, each a cache: give --split NAME (one of them)")
