"""Each sample's source path, stored in its shard: the ``source_bytes`` and ``source_offsets`` columns.

Row ``i``'s path (relative to the raw root, ``/``-separated; a split's cache: to the split's folder,
which the manifest's ``source.prefix`` names relative to the raw root) is
``source_bytes[source_offsets[i]:source_offsets[i + 1]]``: the file name's own bytes, UTF-8 for
UTF-8 names and unchanged otherwise. Kept in the shard, the paths cost the manifest nothing
(ImageNet's 1.28M paths are ~50 MB), are covered by the shard's sha256, and travel with it
through ``--update``, ``convert`` and object storage.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import CacheError

__all__ = ["SOURCE_BYTES", "SOURCE_OFFSETS", "PREFIX", "pack_sources", "source_at", "source_prefix"]

SOURCE_BYTES = "source_bytes"
SOURCE_OFFSETS = "source_offsets"
#: The manifest's ``source`` key naming a split's folder relative to the RAW given to the build.
PREFIX = "prefix"
#: The longest prefix a reader takes (a path, not a document).
_MAX_PREFIX = 4096


def pack_sources(paths: Sequence[str]) -> dict[str, np.ndarray]:
    """The two columns for ``paths`` (one per row; ``os.fsdecode``-style strings)."""
    encoded = [os.fsencode(p) for p in paths]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
    return {SOURCE_BYTES: data, SOURCE_OFFSETS: offsets}


def source_at(column: Callable, row: int, samples: int, where: str) -> str:
    """Row ``row``'s path from a shard reader's ``column(name, index)``, as ``os.fsdecode`` gives it.

    ``samples`` is the shard's row count from the manifest; offsets are checked before they are used.
    """
    try:
        ends = np.asarray(column(SOURCE_OFFSETS, slice(row, row + 2)))
    except (KeyError, ValueError, IndexError, OSError) as exc:
        raise CacheError(f"{where}: no readable {SOURCE_OFFSETS!r} column ({type(exc).__name__})") from None
    if (
        ends.shape != (2,)
        or ends.dtype.kind not in "iu"
        or not 0 <= ends[0] <= ends[1]
        or ends[1] - ends[0] > 65536
    ):
        raise CacheError(f"{where}: {SOURCE_OFFSETS!r} of row {row} of {samples} are not valid")
    try:
        data = np.asarray(column(SOURCE_BYTES, slice(int(ends[0]), int(ends[1]))))
    except (KeyError, ValueError, IndexError, OSError) as exc:
        raise CacheError(f"{where}: no readable {SOURCE_BYTES!r} column ({type(exc).__name__})") from None
    if data.dtype != np.uint8 or data.size != ends[1] - ends[0]:
        raise CacheError(f"{where}: {SOURCE_OFFSETS!r} point outside {SOURCE_BYTES!r}")
    return os.fsdecode(data.tobytes())


def source_prefix(source: dict, where: str) -> str:
    """What goes before each stored path so that it is relative to the RAW given to the build: the
    manifest's ``source.prefix`` and a ``/`` (a split's cache stores paths relative to its split's own
    folder, ``images/train``), or "" where there is none (the whole RAW; a cache built before it was
    recorded). A prefix that is not a relative path is one line."""
    prefix = source.get(PREFIX, "")
    if prefix == "":
        return ""
    if (
        not isinstance(prefix, str)
        or len(prefix) > _MAX_PREFIX
        or "\0" in prefix
        or prefix.startswith("/")
        or prefix.endswith("/")
    ):
        raise CacheError(f"{where}: source.{PREFIX} {str(prefix)[:80]!r} is not a relative folder")
    return prefix + "/"
