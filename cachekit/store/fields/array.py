"""``array``: a numeric array per sample of one dtype, of a fixed shape or of each sample's own.

``params``: ``dtype`` (one of the manifest's dtypes) and ``shape``, a list whose entries are sizes
or ``null`` where samples differ. Fixed shapes are one ``[N, *shape]`` column; others keep each
sample's values flat, back to back, with its shape beside them. Arrays are data: geometry never
moves them (a per-pixel map that must follow crops and flips is a ``mask``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...errors import CacheError
from ..limits import MAX_ARRAY_BYTES, short
from .base import Column, FieldKind, ShardRows, column_name, pack_ragged, ragged_rows

__all__ = ["ArrayKind", "ARRAY_DTYPES"]

ARRAY_DTYPES = ("|u1", "<u2", "<i4", "<i8", "<f4", "<f8")


class ArrayKind(FieldKind):
    kind = "array"

    def check_params(self, params: dict, where: str) -> dict:
        dtype, shape = params.get("dtype"), params.get("shape")
        if dtype not in ARRAY_DTYPES:
            raise CacheError(f"{where}.dtype: expected one of {', '.join(ARRAY_DTYPES)}, got {short(dtype)}")
        if (
            not isinstance(shape, list)
            or len(shape) > 8
            or not all(
                v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31) for v in shape
            )
        ):
            raise CacheError(f"{where}.shape: expected up to 8 sizes or nulls, got {short(shape)}")
        fixed = [v for v in shape if v is not None]
        if math.prod(fixed) * int(dtype[2:]) > MAX_ARRAY_BYTES:
            raise CacheError(f"{where}.shape: {shape} is over {MAX_ARRAY_BYTES} bytes a sample")
        return {"dtype": dtype, "shape": list(shape)}

    @staticmethod
    def _fixed(params: dict) -> bool:
        return None not in params["shape"]

    def columns(self, name: str, params: dict) -> dict[str, Column]:
        if self._fixed(params):
            return {name: Column(tuple(params["shape"]), params["dtype"])}
        return {
            column_name(name, "values"): Column((), params["dtype"], ragged=True),
            column_name(name, "shapes"): Column((len(params["shape"]),), "<i8"),
            column_name(name, "offsets"): Column((), "<i8"),
        }

    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        arrays = [np.asarray(v, dtype=params["dtype"]) for v in values]
        if self._fixed(params):
            shape = tuple(params["shape"])
            out = np.zeros((len(arrays), *shape), dtype=params["dtype"])
            for i, a in enumerate(arrays):
                out[i] = a.reshape(shape)
            return {name: out}
        data, offsets = pack_ragged([a.reshape(-1) for a in arrays], params["dtype"])
        shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(
            len(arrays), len(params["shape"])
        )
        return {
            column_name(name, "values"): data,
            column_name(name, "shapes"): shapes,
            column_name(name, "offsets"): offsets,
        }

    def read(self, name: str, params: dict, shard: ShardRows) -> list:
        if self._fixed(params):
            return [np.array(v) for v in shard.take(name)]
        shapes = np.asarray(shard.column(column_name(name, "shapes"), slice(None)))
        values, offsets = column_name(name, "values"), column_name(name, "offsets")
        found = ragged_rows(shard.column, values, offsets, shard.rows, shard.samples, memo=shard.memo)
        out = []
        for row, (flat,) in zip(shard.rows, found):
            shape = tuple(int(v) for v in shapes[row])
            if any(d < 0 for d in shape) or math.prod(shape) != len(flat):
                raise CacheError(f"{name!r}: a stored array does not have the shape {list(shape)} it records")
            out.append(np.array(flat).reshape(shape))
        return out
