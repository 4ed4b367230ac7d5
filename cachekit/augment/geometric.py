"""The geometric transforms beyond crop, resize and flip: flips, rotations, affine and perspective maps,
zoom-out and SSD's IoU crop, as descriptions (torchvision v2's names, parameters and meanings).

Each is one 3x3 map per sample, drawn from (seed, epoch, index) (``cachekit.augment.matrices``) and
composed with the rest of a list's geometry into the one map that moves the sample's pixels, boxes
and masks (``cachekit.augment.warpmatrix``). Angles are in degrees; fills are 0-255 grey levels.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from .protocol import Geometric
from .transforms import _is_int, _pair_of_numbers

__all__ = [
    "RandomVerticalFlip",
    "RandomRotation",
    "RandomAffine",
    "RandomPerspective",
    "RandomZoomOut",
    "RandomIoUCrop",
    "check_p",
    "check_fill",
]

#: Largest zoom-out factor and shear (degrees) taken: beyond, an image is a dot or a line.
MAX_ZOOM_OUT = 16.0
MAX_SHEAR = 80.0
MAX_SCALE = 16.0
MAX_PERSPECTIVE = (
    0.001  # Ultralytics' documented range (0-0.001); past it a map folds an image through its horizon
)


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_p(p, name: str) -> float:
    """A probability in [0, 1], or a one-line ValueError."""
    if not _number(p) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{name}: p must be in [0, 1], got {p!r}")
    return float(p)


def check_fill(fill, name: str) -> int:
    """A grey level 0-255, or a one-line ValueError."""
    if isinstance(fill, bool) or not isinstance(fill, numbers.Integral) or not 0 <= fill <= 255:
        raise ValueError(f"{name}: fill must be an integer 0-255, got {fill!r}")
    return int(fill)


def degrees_range(value, name: str) -> tuple[float, float]:
    """torchvision's forms: a number ``d >= 0`` is ``(-d, d)``, a pair ``(min, max)`` itself (within +-360)."""
    if _number(value):
        d = float(value)
        if not (math.isfinite(d) and 0 <= d <= 360):
            raise ValueError(f"{name}: degrees must be a number in [0, 360] or (min, max), got {value!r}")
        return -d, d
    a, b = _pair_of_numbers(value, f"{name} degrees")
    if not -360 <= a <= b <= 360:
        raise ValueError(f"{name}: degrees (min, max) must have -360 <= min <= max <= 360, got {value!r}")
    return a, b


def shear_ranges(value, name: str) -> tuple[float, float, float, float] | None:
    """torchvision's forms: ``s`` is x in (-s, s); a pair x in (min, max); four values x then y ranges."""
    if value is None:
        return None
    if _number(value):
        s = float(value)
        if not (math.isfinite(s) and 0 <= s <= MAX_SHEAR):
            raise ValueError(f"{name}: shear must be a number in [0, {MAX_SHEAR:g}] or ranges, got {value!r}")
        return -s, s, 0.0, 0.0
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 4):
        raise ValueError(
            f"{name}: shear must be a number, (min, max) or (xmin, xmax, ymin, ymax), got {value!r}"
        )
    x = _pair_of_numbers(value[:2], f"{name} shear")
    y = _pair_of_numbers(value[2:], f"{name} shear") if len(value) == 4 else (0.0, 0.0)
    for lo, hi in (x, y):
        if not -MAX_SHEAR <= lo <= hi <= MAX_SHEAR:
            raise ValueError(
                f"{name}: shear ranges must have -{MAX_SHEAR:g} <= min <= max <= {MAX_SHEAR:g}, got {value!r}"
            )
    return (*x, *y)


@dataclass(frozen=True)
class RandomVerticalFlip(Geometric):
    """Mirror top-bottom with probability ``p``."""

    MIRROR = True
    GENERAL = True
    DRAWS = 1

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        from .matrices import draw_uniforms, vertical_flip

        return vertical_flip(self, draw_uniforms(seed, epoch, idx, stream, self), vh), vh, vw

    p: float = 0.5

    def __post_init__(self) -> None:
        check_p(self.p, "RandomVerticalFlip")


@dataclass(frozen=True)
class RandomRotation(Geometric):
    """Rotate by an angle uniform in ``degrees`` (a number ``d``: (-d, d)), counter-clockwise, about
    ``center`` (x, y in pixels; default the image's centre), as torchvision's. ``expand=True`` grows
    the output to hold the whole turned image (its size then varies: end the list in a fixed size).
    Corners the image leaves take ``fill``."""

    degrees: float | tuple[float, float]
    expand: bool = False
    center: tuple[float, float] | None = None
    fill: int = 0

    def __post_init__(self) -> None:
        degrees_range(self.degrees, "RandomRotation")
        if not isinstance(self.expand, bool):
            raise ValueError(f"RandomRotation: expand must be True or False, got {self.expand!r}")
        if self.center is not None:
            _pair_of_numbers(self.center, "RandomRotation center")
        check_fill(self.fill, "RandomRotation")

    GENERAL = True
    DRAWS = 1

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        from .matrices import draw_uniforms, rotation

        return rotation(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw)

    def map_fill(self, fill):
        return self.fill

    def fixed_size(self, size):
        return None if self.expand else size

    def size_varies(self, varies: bool) -> bool:
        if not self.expand:
            return varies
        lo, hi = degrees_range(self.degrees, "RandomRotation")
        return varies or lo != hi


@dataclass(frozen=True)
class RandomAffine(Geometric):
    """torchvision's random affine map about the image's centre: an angle uniform in ``degrees``
    (clockwise, as torchvision's ``affine``), a shift of up to ``translate`` = (fx, fy) of the width
    and height (whole pixels), a scale uniform in ``scale`` = (min, max), and ``shear`` (degrees: a
    number ``s`` shears x in (-s, s), a pair x in (min, max), four values x and y).

    ``perspective`` (Ultralytics' term, default 0): the map's two perspective terms uniform in
    (-perspective, perspective) around the centre, as Ultralytics' ``RandomPerspective`` draws them
    (0.0005 is a strong one). With ``degrees``, ``translate``, ``scale`` and ``shear`` this covers
    Ultralytics' augmentation (its ``scale=0.5`` is ``scale=(0.5, 1.5)`` here; its ``translate=0.1``
    is ``translate=(0.1, 0.1)``). After ``Mosaic`` it acts on the mosaic's centre as Ultralytics'
    does with its border of -size/2.
    """

    degrees: float | tuple[float, float] = 0.0
    translate: tuple[float, float] | None = None
    scale: tuple[float, float] | None = None
    shear: float | tuple[float, ...] | None = None
    fill: int = 0
    perspective: float = 0.0
    _shear: tuple | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        degrees_range(self.degrees, "RandomAffine")
        if self.translate is not None:
            a, b = _pair_of_numbers(self.translate, "RandomAffine translate")
            if not (0 <= a <= 1 and 0 <= b <= 1):
                raise ValueError(
                    f"RandomAffine: translate fractions must be in [0, 1], got {self.translate!r}"
                )
        if self.scale is not None:
            a, b = _pair_of_numbers(self.scale, "RandomAffine scale")
            if not 0 < a <= b <= MAX_SCALE:
                raise ValueError(
                    f"RandomAffine: scale must be (min, max) with 0 < min <= max <= {MAX_SCALE:g}, "
                    f"got {self.scale!r}"
                )
        object.__setattr__(self, "_shear", shear_ranges(self.shear, "RandomAffine"))
        check_fill(self.fill, "RandomAffine")
        if not _number(self.perspective) or not 0 <= float(self.perspective) <= MAX_PERSPECTIVE:
            raise ValueError(
                f"RandomAffine: perspective must be a number in [0, {MAX_PERSPECTIVE}], got {self.perspective!r}"
            )

    GENERAL = True
    DRAWS = 8

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        from .matrices import affine, draw_uniforms

        return affine(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw), vh, vw

    def map_fill(self, fill):
        return self.fill

    @property
    def shear_ranges(self) -> tuple[float, float, float, float]:
        return self._shear or (0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class RandomPerspective(Geometric):
    """With probability ``p``, move each corner inwards by up to ``distortion_scale`` of half the side
    (torchvision's draw) and warp the image onto them; uncovered pixels take ``fill``."""

    distortion_scale: float = 0.5
    p: float = 0.5
    fill: int = 0

    def __post_init__(self) -> None:
        if not _number(self.distortion_scale) or not 0 <= float(self.distortion_scale) <= 1:
            raise ValueError(
                f"RandomPerspective: distortion_scale must be in [0, 1], got {self.distortion_scale!r}"
            )
        check_p(self.p, "RandomPerspective")
        check_fill(self.fill, "RandomPerspective")

    GENERAL = True
    DRAWS = 9

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        from .matrices import draw_uniforms, perspective

        return perspective(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw), vh, vw

    def map_fill(self, fill):
        return self.fill


@dataclass(frozen=True)
class RandomZoomOut(Geometric):
    """With probability ``p``, place the image on a canvas ``r`` times its size (``r`` uniform in
    ``side_range``, at a uniform place) filled with ``fill``: SSD's zoom-out, torchvision's. The output
    size then varies: end the list in a fixed size."""

    fill: int = 0
    side_range: tuple[float, float] = (1.0, 4.0)
    p: float = 0.5

    def __post_init__(self) -> None:
        check_fill(self.fill, "RandomZoomOut")
        a, b = _pair_of_numbers(self.side_range, "RandomZoomOut side_range")
        if not 1.0 <= a <= b <= MAX_ZOOM_OUT:
            raise ValueError(
                f"RandomZoomOut: side_range must have 1 <= min <= max <= {MAX_ZOOM_OUT:g}, got {self.side_range!r}"
            )
        check_p(self.p, "RandomZoomOut")

    GENERAL = True

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        from .matrices import draw_uniforms, zoom_out

        return zoom_out(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw)

    def map_fill(self, fill):
        return self.fill

    def fixed_size(self, size):
        return None

    def size_varies(self, varies: bool) -> bool:
        lo, hi = self.side_range
        return varies or not (hi == 1.0 or self.p == 0.0 or (self.p == 1.0 and lo == hi))


@dataclass(frozen=True)
class RandomIoUCrop(Geometric):
    """SSD's crop (torchvision's ``RandomIoUCrop``): draw an option from ``sampler_options`` (a value
    >= 1 leaves the sample as it is); try ``trials`` crops of ``min_scale``-``max_scale`` of each side
    with an aspect ratio in range, keep the first holding some box's centre with an IoU >= the option
    with one of them; boxes whose centres fall outside the crop are dropped. Needs a cache with
    boxes; the output size varies: end the list in a fixed size. Where torchvision redraws options
    until a crop fits, at most ``ROUNDS`` options are drawn here (then the sample is left whole)."""

    min_scale: float = 0.3
    max_scale: float = 1.0
    min_aspect_ratio: float = 0.5
    max_aspect_ratio: float = 2.0
    sampler_options: tuple[float, ...] | None = None
    trials: int = 40

    ROUNDS = 10
    GENERAL = True
    NEEDS_BOXES = True

    @property
    def DRAWS(self) -> int:  # noqa: N802 -- the protocol's name for it
        return self.ROUNDS * (1 + 4 * self.trials)

    def fixed_size(self, size):
        return None

    def size_varies(self, varies: bool) -> bool:
        return varies or any(v < 1.0 for v in self.options)

    def __post_init__(self) -> None:
        lo, hi = _pair_of_numbers((self.min_scale, self.max_scale), "RandomIoUCrop min_scale/max_scale")
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"RandomIoUCrop: need 0 < min_scale <= max_scale <= 1, got {lo}, {hi}")
        lo, hi = _pair_of_numbers(
            (self.min_aspect_ratio, self.max_aspect_ratio), "RandomIoUCrop min/max_aspect_ratio"
        )
        if not 0 < lo <= hi <= 100:
            raise ValueError(
                f"RandomIoUCrop: need 0 < min_aspect_ratio <= max_aspect_ratio <= 100, got {lo}, {hi}"
            )
        options = self.options
        if not options or len(options) > 64 or not all(_number(v) and 0 <= v < math.inf for v in options):
            raise ValueError(
                f"RandomIoUCrop: sampler_options must be 1-64 finite numbers >= 0, got {self.sampler_options!r}"
            )
        if not _is_int(self.trials) or not 1 <= self.trials <= 1000:
            raise ValueError(f"RandomIoUCrop: trials must be an integer 1-1000, got {self.trials!r}")
        if self.sampler_options is not None:  # a tuple: the transform stays hashable, like the others
            object.__setattr__(self, "sampler_options", tuple(float(v) for v in options))

    @property
    def options(self) -> tuple[float, ...]:
        if self.sampler_options is None:
            return (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 2.0)
        if isinstance(self.sampler_options, (str, bytes)) or not hasattr(self.sampler_options, "__len__"):
            return ()
        return tuple(self.sampler_options)
