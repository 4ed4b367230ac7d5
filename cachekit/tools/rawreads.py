"""The raw inputs the bench's raw loaders read: files under a folder, or the records of Parquet files,
WebDataset tars or a Python dataset, each read as a build reads it (``build.records``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..build.shardjob import read_input
from ..build.sources import discover
from ..build.sources.discovery import record_files_kind
from ..build.sources.inputtable import Source
from ..build.sources.records import Record
from ..errors import UsageError

__all__ = ["RawReads", "raw_source"]


def raw_source(raw, discover_options: dict | None = None) -> Source:
    """The inputs of ``raw``: a folder (``discover``), Parquet or tar files by pattern, or a dataset."""
    from ..build.config import BuildConfig
    from ..build.sources.pydataset import dataset_source
    from ..build.sources.sourceoptions import recorded

    options = dict(discover_options or {})
    how = recorded(options.pop("source", {}))  # a file source: read as the cache's build read it
    if isinstance(raw, (str, os.PathLike)):
        if record_files_kind(os.fspath(raw)) and not Path(raw).is_dir():
            from ..build.findsource import find_source

            return find_source(os.fspath(raw), None, BuildConfig(source=how))[1]
        return discover(raw, **options)
    if hasattr(raw, "__len__") and hasattr(raw, "__getitem__"):
        return dataset_source(raw, BuildConfig().source.samples())
    raise UsageError("the raw baseline needs random access: a folder, Parquet or tar files, or a dataset")


@dataclass
class RawReads:
    """Input ``i``'s bytes (or a dataset's pixels), read as a build reads it; picklable, the source's
    reader opened once in each process that reads."""

    root: Path
    paths: tuple[str, ...]
    targets: tuple = ()
    reader: object | None = None
    _read: object = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_read": None}

    def read(self, i: int) -> bytes | np.ndarray:
        if self.reader is None:
            return read_input(self.root / self.paths[i])
        if self._read is None:
            self._read = self.reader.open(None, 0)
        found = self._read(self.paths[i], self.targets[i] if self.targets else None)
        return found.image if isinstance(found, Record) else found

    def files(self) -> list[Path]:
        """The files the inputs are read from (for the bench to drop from the page cache)."""
        if self.reader is None:
            return [self.root / p for p in self.paths]
        return [Path(f) for f in getattr(self.reader, "files", ()) if "://" not in str(f)]

    def subset(self, keep: list[int]) -> RawReads:
        return RawReads(
            self.root,
            tuple(self.paths[i] for i in keep),
            tuple(self.targets[i] for i in keep) if self.targets else (),
            self.reader,
        )
