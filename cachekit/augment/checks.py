"""The argument checks every transform shares: one rule each, one line when refused.

The bottom of the augment wing: it imports nothing of it, and every transform module takes its
checks from here (a probability, a fill, a size, a range, torchvision's forms of degrees and shear).
"""

from __future__ import annotations

import math
import numbers

from ..constants import MAX_SIDE

__all__ = [
    "MAX_JITTER",
    "MAX_SHEAR",
    "check_count",
    "check_fill",
    "check_p",
    "check_size",
    "degrees_range",
    "is_int",
    "is_real",
    "jitter_range",
    "pair_of_numbers",
    "positive_range",
    "shear_ranges",
]

#: The largest brightness, contrast or saturation factor taken (past a few, every pixel is already at 0 or 255).
MAX_JITTER = 1000.0
#: The widest shear, in degrees (past it a sample is a few lines of pixels).
MAX_SHEAR = 80.0


def is_int(v) -> bool:
    """An integer, not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v) -> bool:
    """A real number, not a bool (NaN and infinities included: callers bound them)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_p(p, name: str) -> float:
    """A probability: a number in [0, 1] (NaN fails both comparisons)."""
    if not is_real(p) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{name}: p must be a number in [0, 1], got {p!r}")
    return float(p)


def check_fill(fill, name: str, *, per_channel: bool = False):
    """What fills pixels from outside the image. A warp's (``per_channel=False``): one grey level,
    an integer 0-255. A pixel transform's (``per_channel=True``): one pixel value 0-255 for every
    channel or three, one per RGB channel, None for 0 (torchvision's forms), as a tuple; a
    one-channel sample takes the first."""
    if not per_channel:
        if not is_int(fill) or not 0 <= fill <= 255:
            raise ValueError(f"{name}: fill must be an integer 0-255, got {fill!r}")
        return int(fill)
    if fill is None:
        return (0,)
    values = tuple(fill) if isinstance(fill, (tuple, list)) else (fill,)
    if len(values) not in (1, 3) or not all(is_real(v) and 0 <= v <= 255 for v in values):
        raise ValueError(f"{name}: fill must be a pixel value 0-255 or one per RGB channel, got {fill!r}")
    return tuple(int(round(float(v))) for v in values)


def check_size(value, name: str) -> tuple[int, int]:
    """An output size: a positive int (a square) or ``(height, width)``, within ``MAX_SIDE``."""
    pair = (value, value) if is_int(value) else value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(is_int(v) and v > 0 for v in pair):
        raise ValueError(f"{name}: size must be a positive int or (height, width), got {value!r}")
    if max(pair) > MAX_SIDE:
        raise ValueError(
            f"{name}: size {value!r} is past the largest side an image may have, {MAX_SIDE} pixels"
        )
    return int(pair[0]), int(pair[1])


def check_count(value, name: str, low: int, high: int) -> int:
    """An integer in ``[low, high]``."""
    if not is_int(value) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def pair_of_numbers(value, name: str) -> tuple[float, float]:
    """Two finite numbers ``(min, max)`` (their order is the caller's to check)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name}: expected (min, max), got {value!r}")
    if not all(is_real(v) for v in value):
        raise ValueError(f"{name}: expected two numbers, got {value!r}")
    a, b = (float(v) for v in value)
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"{name}: expected finite numbers, got {value!r}")
    return a, b


def positive_range(value, name: str, low: float = 0.0) -> tuple[float, float]:
    """``(min, max)`` with ``low < min <= max``."""
    a, b = pair_of_numbers(value, name)
    if not low < a <= b:
        raise ValueError(f"{name}: expected {low} < min <= max, got {value!r}")
    return a, b


def jitter_range(value, name: str, centre: float, low: float, high: float = MAX_JITTER) -> tuple[float, float]:
    """ColorJitter's forms, as torchvision's: a number ``x`` is ``[centre - x, centre + x]`` (clipped
    at ``low``), a pair is ``(min, max)`` itself; both within ``[low, high]``."""
    if is_real(value):
        x = float(value)
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"ColorJitter: {name} must be a finite number >= 0 or (min, max), got {value!r}")
        a, b = max(low, centre - x), centre + x
    else:
        a, b = pair_of_numbers(value, f"ColorJitter {name}")
        if not low <= a <= b:
            raise ValueError(f"ColorJitter: {name} (min, max) must have {low} <= min <= max, got {value!r}")
    if b > high:
        raise ValueError(f"ColorJitter: {name} must stay within [{low}, {high}], got {value!r}")
    return a, b


def degrees_range(value, name: str) -> tuple[float, float]:
    """torchvision's forms: a number ``d >= 0`` is ``(-d, d)``, a pair ``(min, max)`` itself (within +-360)."""
    if is_real(value):
        d = float(value)
        if not (math.isfinite(d) and 0 <= d <= 360):
            raise ValueError(f"{name}: degrees must be a number in [0, 360] or (min, max), got {value!r}")
        return -d, d
    a, b = pair_of_numbers(value, f"{name} degrees")
    if not -360 <= a <= b <= 360:
        raise ValueError(f"{name}: degrees (min, max) must have -360 <= min <= max <= 360, got {value!r}")
    return a, b


def shear_ranges(value, name: str) -> tuple[float, float, float, float] | None:
    """torchvision's forms: ``s`` is x in (-s, s); a pair x in (min, max); four values x then y ranges."""
    if value is None:
        return None
    if is_real(value):
        s = float(value)
        if not (math.isfinite(s) and 0 <= s <= MAX_SHEAR):
            raise ValueError(f"{name}: shear must be a number in [0, {MAX_SHEAR:g}] or ranges, got {value!r}")
        return -s, s, 0.0, 0.0
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 4):
        raise ValueError(
            f"{name}: shear must be a number, (min, max) or (xmin, xmax, ymin, ymax), got {value!r}"
        )
    x = pair_of_numbers(value[:2], f"{name} shear")
    y = pair_of_numbers(value[2:], f"{name} shear") if len(value) == 4 else (0.0, 0.0)
    for lo, hi in (x, y):
        if not -MAX_SHEAR <= lo <= hi <= MAX_SHEAR:
            raise ValueError(
                f"{name}: shear ranges must have -{MAX_SHEAR:g} <= min <= max <= {MAX_SHEAR:g}, got {value!r}"
            )
    return (*x, *y)
