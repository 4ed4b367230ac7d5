"""Tiny typed readers of a parsed JSON object, each raising CacheError that names the field: what
the manifest's validation is made of, so that no hostile value reaches arithmetic."""

from __future__ import annotations

import math
from typing import Any

from ..errors import CacheError
from .limits import MAX_INT, short

__all__ = ["DTYPES", "get", "get_int", "get_str", "get_floats", "shape_of", "itemsize", "dtype_of"]

#: The dtypes a manifest may name, as numpy strings with explicit byte order.
DTYPES = {"|u1", "<u2", "<i4", "<i8", "<f4", "<f8"}


def get(obj: dict, key: str, where: str) -> Any:
    if not isinstance(obj, dict):
        raise CacheError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise CacheError(f"{where}: missing field {key!r}")
    return obj[key]


def get_int(obj: dict, key: str, where: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
    value = get(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise CacheError(
            f"{where}.{key}: expected an integer from {minimum} to {maximum}, got {short(value)}"
        )
    return value


def get_str(obj: dict, key: str, where: str) -> str:
    value = get(obj, key, where)
    if not isinstance(value, str):
        raise CacheError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def get_floats(obj: dict, key: str, where: str, length: int | None = None) -> tuple[float, ...]:
    value = get(obj, key, where)
    ok = isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    )
    if not ok or (length is not None and len(value) != length):
        size = f" of {length}" if length is not None else ""
        raise CacheError(f"{where}.{key}: expected a list{size} finite numbers, got {value!r}")
    return tuple(float(v) for v in value)


def shape_of(value: Any, where: str, max_bytes: int, itemsize: int = 1) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or len(value) > 8
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31 for v in value)
    ):
        raise CacheError(f"{where}: expected a list of up to 8 positive integers, got {short(value)}")
    if math.prod(value) * itemsize > max_bytes:
        raise CacheError(
            f"{where}: {value} is {math.prod(value) * itemsize} bytes a sample, over {max_bytes}"
        )
    return tuple(value)


def itemsize(dtype: str) -> int:
    return int(dtype[2:])


def dtype_of(value: Any, where: str) -> str:
    if not isinstance(value, str) or value not in DTYPES:
        raise CacheError(f"{where}: unsupported dtype {value!r} (known: {sorted(DTYPES)})")
    return value
