"""Storage backends behind one protocol, dispatched on the manifest's ``format``."""

from __future__ import annotations

from ...errors import CacheError, UsageError
from ..samplespec import SHARD_NAME_COLUMN
from .base import OpenFilesExhausted, ShardFormat, ShardReader, identity_column
from .hdf5 import Hdf5Format
from .pt import PtFormat
from .zarr import ZarrFormat

__all__ = [
    "FORMATS",
    "SHARD_NAME_COLUMN",
    "OpenFilesExhausted",
    "ShardFormat",
    "ShardReader",
    "get_format",
    "identity_column",
]

FORMATS: dict[str, ShardFormat] = {"pt": PtFormat(), "hdf5": Hdf5Format(), "zarr": ZarrFormat()}


def get_format(name: str, *, reading: bool = False) -> ShardFormat:
    """The backend called ``name``; unknown names are a UsageError when building, CacheError when reading."""
    try:
        return FORMATS[name]
    except KeyError:
        known = ", ".join(FORMATS)
        if reading:
            raise CacheError(
                f"manifest.format: unknown format {name!r} (this cachekit reads {known})"
            ) from None
        raise UsageError(f"unknown format {name!r} (choose from {known})") from None
