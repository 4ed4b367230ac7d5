"""What every field kind shares: the methods a kind has (``FieldKind``; ``unpack``, as the readers
call it, the same for all), the kinds kept as one ragged column (``RaggedKind``), the rows a read
asks of an open shard (``ShardRows``), and packing/unpacking of ragged values.

A field is a named, typed part of a sample besides its image (a class, several classes, boxes, a
mask, a caption, an array). Each kind (one small module each) says which columns it stores, packs
a shard's per-sample values into them and unpacks rows again; the writer and the readers never
branch on the kind. A ragged field keeps every sample's values back to back in a ``values``
column and ``N + 1`` int64 ``offsets``; both are checked before they are used.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import CacheError

__all__ = [
    "Column",
    "FieldKind",
    "RaggedKind",
    "ShardRows",
    "ColumnReader",
    "pack_ragged",
    "ragged_gather",
    "ragged_rows",
    "column_name",
]

#: The most values ``ragged_gather`` takes through one index array (an int64 each, 1 MiB at most);
#: more are copied slice by slice, so a read's memory stays a small multiple of what it returns.
_INDEXED_GATHER = 1 << 16

#: ``column(name, index)``: rows of one column of an open shard (``index`` a slice or an array).
ColumnReader = Callable[[str, Any], np.ndarray]


@dataclass(frozen=True)
class Column:
    """One stored column: its per-row shape and dtype; a ``ragged`` column has any number of rows."""

    shape: tuple[int, ...]  # of one row
    dtype: str  # "<f4", "|u1", ...
    ragged: bool = False


@dataclass(frozen=True)
class ShardRows:
    """The rows a read asks of one open shard: ``column`` reads its columns, ``rows`` are local row
    numbers, ``samples`` its number of rows, ``memo`` a dict kept with the open shard (what was read
    and checked of it whole), or None."""

    column: ColumnReader
    rows: Sequence[int]
    samples: int
    memo: dict | None = None

    def take(self, name: str) -> np.ndarray:
        """The rows' values of ``name``, a column of one value per sample."""
        return np.asarray(self.column(name, np.asarray(self.rows, dtype=np.int64)))


class FieldKind(ABC):
    """One kind of field: its columns, and how a shard's values go into them and come back. Each
    kind (one small module) says what is its own: its parameters, its columns, its packing and how
    rows are read (``read``); the readers call ``unpack``, the same for every kind."""

    kind: str

    def check_params(self, params: dict, where: str) -> dict:
        """The kind's parameters from a manifest, validated (CacheError naming ``where``); a kind
        without parameters keeps none."""
        return {}

    @abstractmethod
    def columns(self, name: str, params: dict) -> dict[str, Column]:
        """Every column a field called ``name`` stores (its name is part of each column's)."""

    @abstractmethod
    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        """A shard's columns from each sample's value, in row order."""

    @abstractmethod
    def read(self, name: str, params: dict, shard: ShardRows) -> list:
        """The values of ``shard.rows``, in that order."""

    def unpack(
        self,
        name: str,
        params: dict,
        column: ColumnReader,
        rows: Sequence[int],
        samples: int,
        memo: dict | None = None,
    ) -> list:
        """The values of ``rows`` (local row numbers of a shard of ``samples`` rows). ``memo``: a dict
        kept with the open shard, where what was read and checked of it whole is kept."""
        return self.read(name, params, ShardRows(column, rows, samples, memo))


class RaggedKind(FieldKind):
    """A kind stored as one ragged column (``part``: every sample's values back to back) and its
    offsets. The kind says how a sample's value is stored (``encode``, into values of shape
    ``tail``) and how a row's stored values come back (``decode``)."""

    part: str
    dtype: str

    def tail(self, params: dict) -> tuple[int, ...]:
        """The shape of one stored value: ``()`` for a number or a byte."""
        return ()

    @abstractmethod
    def encode(self, value: Any, params: dict) -> np.ndarray:
        """A sample's value as its rows of the ``part`` column."""

    def decode(self, name: str, stored: np.ndarray) -> Any:
        """A row's value from its slice of the ``part`` column (a view of a fresh array)."""
        return stored

    def columns(self, name: str, params: dict) -> dict[str, Column]:
        return {
            column_name(name, self.part): Column(self.tail(params), self.dtype, ragged=True),
            column_name(name, "offsets"): Column((), "<i8"),
        }

    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        stored = [self.encode(v, params) for v in values]
        data, offsets = pack_ragged(stored, self.dtype, self.tail(params))
        return {column_name(name, self.part): data, column_name(name, "offsets"): offsets}

    def gather(
        self, name: str, params: dict, column: ColumnReader, rows: Sequence[int], samples: int, memo=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, values)``: each row's number of values, and the rows' values back to back (a
        fresh array): a batch's values as one array."""
        counts, (values,) = ragged_gather(
            column, column_name(name, self.part), column_name(name, "offsets"), rows, samples, memo=memo
        )
        return counts, values

    def read(self, name: str, params: dict, shard: ShardRows) -> list:
        counts, values = self.gather(name, params, shard.column, shard.rows, shard.samples, shard.memo)
        return [self.decode(name, values[a:b]) for a, b in row_spans(counts)]


def column_name(field: str, part: str) -> str:
    """The column holding ``part`` of field ``field`` (``boxes__offsets``)."""
    return f"{field}__{part}"


def pack_ragged(
    arrays: Sequence[np.ndarray], dtype: str, tail: tuple[int, ...] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)``: the rows of every sample's array back to back, and where each starts."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    if arrays:
        values = np.concatenate([np.asarray(a, dtype=dtype).reshape(-1, *tail) for a in arrays])
    else:
        values = np.zeros((0, *tail), dtype=dtype)
    return np.ascontiguousarray(values.astype(dtype, copy=False)), offsets


def ragged_gather(
    column: ColumnReader,
    values: str,
    offsets: str,
    rows: Sequence[int],
    samples: int,
    extra: Sequence[str] = (),
    memo: dict | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(counts, arrays)``: how many values each of ``rows`` has, and the rows' values of ``values``
    (and of the ``extra`` columns that share its offsets) back to back, as fresh arrays.

    The offsets are read as a whole (they are small), checked to run from 0 up, never down, to the
    length of the values; a shard that says otherwise is a CacheError, never a wrong slice. With a
    ``memo`` (kept with the open shard), the columns are read and checked once per shard.
    """
    key = ("ragged", values, offsets, *extra)
    if memo is not None and key in memo:
        ends, data = memo[key]
    else:
        ends = np.asarray(column(offsets, slice(None)))
        data = [np.asarray(column(name, slice(None))) for name in (values, *extra)]
        if (
            ends.shape != (samples + 1,)
            or ends.dtype.kind not in "iu"
            or (samples and (ends[0] != 0 or (np.diff(ends) < 0).any()))
            or any(len(d) != (int(ends[-1]) if samples else len(d)) for d in data)
        ):
            raise CacheError(f"{offsets!r} do not match {values!r} (the shard is damaged)")
        ends = ends.astype(np.int64)
        if memo is not None:
            memo[key] = ends, data
    rows = np.asarray(rows, dtype=np.int64)
    lo, hi = ends[rows], ends[rows + 1]
    counts = hi - lo
    total = int(counts.sum())
    if total <= _INDEXED_GATHER:
        # a few values: one index of them (at most _INDEXED_GATHER int64s), the fastest for a batch
        starts = np.cumsum(counts) - counts  # where each row's values start in the gathered arrays
        take = np.arange(total, dtype=np.int64) + np.repeat(lo - starts, counts)
        return counts, [d[take] for d in data]
    # many values: slices copied once into the result, never an index as large as the values (an
    # int64 per caption byte); consecutive rows are one slice, a whole shard is one copy
    cut = np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1
    first, last = np.concatenate(([0], cut)), np.concatenate((cut, [len(rows)])) - 1
    spans = list(zip(lo[first].tolist(), hi[last].tolist()))
    return counts, [np.concatenate([d[a:b] for a, b in spans]) for d in data]


def ragged_rows(
    column: ColumnReader,
    values: str,
    offsets: str,
    rows: Sequence[int],
    samples: int,
    extra: Sequence[str] = (),
    memo: dict | None = None,
) -> list[tuple[np.ndarray, ...]]:
    """For each row, its slice of ``values`` (and of the ``extra`` columns that share its offsets):
    views of ``ragged_gather``'s fresh arrays, so a caller may keep or change them."""
    counts, gathered = ragged_gather(column, values, offsets, rows, samples, extra, memo)
    return [tuple(g[a:b] for g in gathered) for a, b in row_spans(counts)]


def row_spans(counts) -> list[tuple[int, int]]:
    """``(start, end)`` of each row's values when rows of ``counts`` values lie back to back."""
    ends = np.cumsum(counts, dtype=np.int64).tolist()
    return list(zip([0, *ends[:-1]], ends))
