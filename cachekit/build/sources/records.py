"""Inputs that are not files under RAW (rows of Parquet files, members of tars, samples of a Python
dataset): the ``Record`` a reader gives a shard job, and when a reader that always fails stops a build.

A source of records gives its ``Source`` a ``reader``: a small picklable value sent with every shard
job, whose ``open(storage_options, max_bytes)`` runs in the worker and gives ``read(rel, target)``:
the input's encoded bytes (its target known at discovery), or a ``Record`` (pixels or bytes, with
the target read along with them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ...errors import BuildError
from ...image.ops import DecodeError
from .reading import read_retrying

__all__ = ["Record", "SourceRaised", "ReaderFailures", "GIVE_UP_AFTER", "RecordReader", "ReadRecord"]

#: A shard job whose first this-many samples all raised in the user's code stops the build.
GIVE_UP_AFTER = 8


@dataclass
class Record:
    """One input as a shard job stores it: ``image`` (HWC uint8 RGB, or encoded bytes to decode), its
    raw target (``sampletargets``' forms: ``xyxy`` boxes, a mask array, ...) and its class (-1: none)."""

    image: bytes | np.ndarray
    target: dict = field(default_factory=dict)
    label: int = -1


class SourceRaised(DecodeError):
    """The user's code (a dataset's ``__getitem__``, an iterator) raised for one sample: a skip."""


class ReaderFailures:
    """Reads through a reader, and stops the build when the user's code raises for every sample."""

    def __init__(self) -> None:
        self.read_ok = 0
        self.raised: list[str] = []

    def read(self, read: Callable, rel: str, target) -> bytes | Record:
        try:
            found = read_retrying(lambda r: read(r, target), rel)
        except SourceRaised as exc:
            self.raised.append(str(exc))
            if not self.read_ok and len(self.raised) >= GIVE_UP_AFTER:
                raise BuildError(
                    f"the source raised for each of the first {len(self.raised)} samples of a shard, the "
                    f"last {rel}: {exc}; fix the dataset (nothing was written)"
                ) from None
            raise
        self.read_ok += 1
        return found


#: What ``RecordReader.open`` gives: ``read(rel, target)``, an input's bytes or its ``Record``.
ReadRecord = Callable[[str, "dict | None"], "bytes | Record"]


@runtime_checkable
class RecordReader(Protocol):
    """``Source.reader`` (step 2 of ``base``'s contract): a small picklable value sent with every shard job."""

    #: True when rows are cheapest read in their stored order (files of records, a stream).
    sequential: bool

    def open(self, storage_options: dict | None, max_bytes: int) -> ReadRecord:
        """In the worker, once per shard job: ``read(rel, target)`` for that job's rows."""
        ...
