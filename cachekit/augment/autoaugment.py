"""RandAugment, TrivialAugmentWide and AutoAugment: the transforms, and as data: torchvision v2's op tables, the draws, one kernel per op.

Each family is a table of (op, magnitudes for ``num_bins`` bins and an ``H x W`` image, signed)
over one shared set of ops, exactly torchvision's; AutoAugment adds its policies' sub-policies
(op, probability, magnitude bin). A batch's draws are each sample's chain of ops (``OpDraws``):
which op, at which signed magnitude, from (seed, epoch, index). The chain runs on a uint8 row
(``pixelkernels``) or on the batch (``pixelbatch``); shears, translations and rotations are one
forward 2x3 map of pixel indices each (``op_matrix``), which also moves the sample's boxes and masks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from ..image.instances import from_pixel_indices
from . import pixelbatch, pixelkernels
from .checks import check_count, check_fill
from .draws import uniforms
from .protocol import Pixel

__all__ = [
    "RandAugment",
    "TrivialAugmentWide",
    "AutoAugment",
    "OpDraws",
    "draw_ops",
    "space_of",
    "op_matrix",
    "GEOMETRIC_OPS",
    "POLICY_TABLES",
]


#: The most operations RandAugment may chain per sample (torchvision sets no bound; 2-4 is usual).
MAX_OPS = 16
#: The most magnitude bins (torchvision's default is 31).
MAX_BINS = 1024
#: AutoAugment's policies, by torchvision's ``AutoAugmentPolicy`` values.
POLICIES = ("imagenet", "cifar10", "svhn")



def _linspace(a: float, b: float):
    return lambda bins, h, w: np.linspace(a, b, bins, dtype=np.float64).astype(np.float32)


def _posterize(quarters: int):
    return lambda bins, h, w: np.round(
        8 - np.arange(bins, dtype=np.float32) / np.float32((bins - 1) / quarters)
    ).astype(np.int32)


def _none(bins, h, w):
    return None


#: torchvision v2's op tables: op -> (magnitudes of ``bins`` bins for an ``h x w`` image, signed).
_RAND_SPACE = {
    "Identity": (_none, False),
    "ShearX": (_linspace(0.0, 0.3), True),
    "ShearY": (_linspace(0.0, 0.3), True),
    "TranslateX": (lambda bins, h, w: _linspace(0.0, 150.0 / 331.0 * w)(bins, h, w), True),
    "TranslateY": (lambda bins, h, w: _linspace(0.0, 150.0 / 331.0 * h)(bins, h, w), True),
    "Rotate": (_linspace(0.0, 30.0), True),
    "Brightness": (_linspace(0.0, 0.9), True),
    "Color": (_linspace(0.0, 0.9), True),
    "Contrast": (_linspace(0.0, 0.9), True),
    "Sharpness": (_linspace(0.0, 0.9), True),
    "Posterize": (_posterize(4), False),
    "Solarize": (_linspace(1.0, 0.0), False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
_WIDE_SPACE = {
    "Identity": (_none, False),
    "ShearX": (_linspace(0.0, 0.99), True),
    "ShearY": (_linspace(0.0, 0.99), True),
    "TranslateX": (_linspace(0.0, 32.0), True),
    "TranslateY": (_linspace(0.0, 32.0), True),
    "Rotate": (_linspace(0.0, 135.0), True),
    "Brightness": (_linspace(0.0, 0.99), True),
    "Color": (_linspace(0.0, 0.99), True),
    "Contrast": (_linspace(0.0, 0.99), True),
    "Sharpness": (_linspace(0.0, 0.99), True),
    "Posterize": (_posterize(6), False),
    "Solarize": (_linspace(1.0, 0.0), False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
_AUTO_SPACE = {**{k: v for k, v in _RAND_SPACE.items() if k != "Identity"}, "Invert": (_none, False)}

#: AutoAugment's sub-policies, as torchvision lists them: ((op, probability, magnitude bin), x2).
POLICY_TABLES = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
    "svhn": (
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ),
}

GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


def space_of(step) -> dict:
    """The op table a transform draws from (its keys are torchvision's names, in its order)."""
    return {"rand": _RAND_SPACE, "wide": _WIDE_SPACE}.get(step.SPACE, _AUTO_SPACE)


def op_matrix(name: str, magnitude: float, h: int, w: int) -> np.ndarray:
    """The forward 2x3 map of pixel indices of a geometric op on an ``h x w`` image, as torchvision's
    ``F.affine`` / ``F.rotate`` place it (shears about the top-left corner, rotations about the centre,
    counter-clockwise for a positive angle; translations truncated to whole pixels). A new array."""
    return _op_matrix(name, float(magnitude), int(h), int(w)).copy()


@functools.lru_cache(maxsize=4096)
def _op_matrix(name: str, magnitude: float, h: int, w: int) -> np.ndarray:
    """``op_matrix``, read-only and kept: an op's magnitudes are a table's few bins, and building the
    map (numpy on 2 x 2 arrays, about 25 us) cost as much as a 224 x 224 translation's warp."""
    a, centre, shift = np.eye(2), np.zeros(2), np.zeros(2)
    if name == "ShearX":
        a[0, 1] = -magnitude
    elif name == "ShearY":
        a[1, 0] = -magnitude
    elif name == "TranslateX":
        shift[0] = int(magnitude)
    elif name == "TranslateY":
        shift[1] = int(magnitude)
    elif name == "Rotate":
        t = math.radians(magnitude)
        a = np.array([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]])
        centre = np.array([w / 2.0, h / 2.0])
    else:
        raise ValueError(f"{name} is not a geometric op")
    # continuous coordinates (pixel i covers [i, i + 1)) to pixel indices: x = i + 0.5
    offset = a @ (0.5 - centre) + centre + shift - 0.5
    matrix = np.concatenate([a, offset[:, None]], axis=1)
    matrix.flags.writeable = False
    return matrix


@dataclass(frozen=True)
class OpDraws:
    """Each sample's chain of ops: ``ops [B, K]`` indexes ``names`` (-1: nothing at that step),
    ``magnitudes [B, K]`` torchvision's signed magnitude (0 for ops without one)."""

    names: tuple[str, ...]
    ops: np.ndarray
    magnitudes: np.ndarray
    fill: tuple[int, ...]
    out_hw: tuple[int, int]

    def _steps(self, j: int):
        for k in range(self.ops.shape[1]):
            op = int(self.ops[j, k])
            if op >= 0 and self.names[op] != "Identity":
                yield self.names[op], float(self.magnitudes[j, k])

    def matrices(self, j: int) -> list[np.ndarray]:
        """Sample ``j``'s geometric ops in order, as the targets take them: each op's forward 2x3 map of
        pixel indices (its pixels') as a 3x3 map of continuous coordinates."""
        h, w = self.out_hw
        return [from_pixel_indices(op_matrix(name, m, h, w)) for name, m in self._steps(j) if name in GEOMETRIC_OPS]

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        h, w = chw.shape[1:]
        for name, m in self._steps(j):
            if name in GEOMETRIC_OPS:
                pixelkernels.affine(chw, _op_matrix(name, m, h, w), self.fill)
            elif name in ("Brightness", "Color", "Contrast", "Sharpness"):
                getattr(pixelkernels, name.lower())(chw, 1.0 + m)
            elif name == "Posterize":
                pixelkernels.posterize(chw, int(m))
            elif name == "Solarize":
                pixelkernels.solarize(chw, 255.0 * m)
            else:  # AutoContrast, Equalize, Invert
                getattr(pixelkernels, name.lower())(chw)

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        for k in range(self.ops.shape[1]):
            for op, name in enumerate(self.names):
                rows = np.flatnonzero(self.ops[:, k] == op)
                if not len(rows) or name == "Identity":
                    continue
                m = self.magnitudes[rows, k]
                index = torch.from_numpy(rows).to(x.device)
                sub = x[index]
                if name in GEOMETRIC_OPS:
                    inverse = np.stack([cv2.invertAffineTransform(op_matrix(name, v, h, w)) for v in m])
                    sub = pixelbatch.affine(sub, torch.from_numpy(inverse), self.fill)
                elif name in ("Brightness", "Color", "Contrast", "Sharpness"):
                    sub = getattr(pixelbatch, name.lower())(sub, torch.from_numpy(1.0 + m).to(x.device))
                elif name == "Posterize":
                    sub = pixelbatch.posterize(sub, torch.from_numpy(m.astype(np.int64)).to(x.device))
                elif name == "Solarize":
                    sub = pixelbatch.solarize(sub, torch.from_numpy(255.0 * m).to(x.device))
                else:
                    sub = getattr(pixelbatch, name.lower())(sub)
                x[index] = sub
        return x


def draw_ops(step, seed: int, epoch: int, idx: np.ndarray, stream: int, out_hw: tuple[int, int]) -> OpDraws:
    """Every sample's chain for ``step`` (RandAugment, TrivialAugmentWide or AutoAugment), as torchvision
    draws it: ops uniform over the table, signed magnitudes negated when a uniform is <= 0.5, AutoAugment's
    ops applied when a uniform is <= their probability."""
    h, w = out_hw
    space = space_of(step)
    names = tuple(space)
    n = len(idx)
    if step.SPACE == "auto":  # AutoAugment: a learned sub-policy per sample
        policies = POLICY_TABLES[step.policy_name()]
        u = uniforms(seed, epoch, idx, stream, 5)
        chosen = np.minimum((u[:, 0] * len(policies)).astype(np.int64), len(policies) - 1)
        ops = np.full((n, 2), -1, dtype=np.int16)
        mags = np.zeros((n, 2))
        for j in range(n):
            for k, (name, probability, bin_) in enumerate(policies[chosen[j]]):
                if not u[j, 1 + 2 * k] <= probability:
                    continue
                ops[j, k] = names.index(name)
                fn, signed = space[name]
                values = fn(10, h, w)
                if values is not None:
                    mags[j, k] = float(values[bin_]) * (-1 if signed and u[j, 2 + 2 * k] <= 0.5 else 1)
        return OpDraws(names, ops, mags, check_fill(step.fill, "AutoAugment", per_channel=True), out_hw)
    fixed = step.SPACE == "rand"  # RandAugment: num_ops ops at one magnitude; else one at a drawn bin
    slots = step.num_ops if fixed else 1
    bins = step.num_magnitude_bins
    u = uniforms(seed, epoch, idx, stream, 3 * slots).reshape(n, slots, 3)
    ops = np.minimum((u[:, :, 0] * len(names)).astype(np.int64), len(names) - 1).astype(np.int16)
    if fixed:
        chosen_bin = np.full((n, slots), step.magnitude, dtype=np.int64)
    else:
        chosen_bin = np.minimum((u[:, :, 2] * bins).astype(np.int64), bins - 1)
    mags = np.zeros((n, slots))
    for op, name in enumerate(names):
        fn, signed = space[name]
        values = fn(bins, h, w)
        if values is None:
            continue
        here = ops == op
        mags[here] = values[chosen_bin[here]].astype(np.float64)
        if signed:
            mags[here & (u[:, :, 1] <= 0.5)] *= -1
    return OpDraws(names, ops, mags, check_fill(step.fill, type(step).__name__, per_channel=True), out_hw)


@dataclass(frozen=True)
class RandAugment(Pixel):
    """``num_ops`` operations drawn uniformly from torchvision's 14 (Identity, ShearX/Y, TranslateX/Y,
    Rotate, Brightness, Color, Contrast, Sharpness, Posterize, Solarize, AutoContrast, Equalize), each
    at bin ``magnitude`` of ``num_magnitude_bins``, signed ones negated half the time. Shears,
    translations and rotations move boxes and masks too; ``fill`` is what they uncover."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    fill: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        check_count(self.num_ops, "RandAugment: num_ops", 0, MAX_OPS)
        bins = check_count(self.num_magnitude_bins, "RandAugment: num_magnitude_bins", 2, MAX_BINS)
        check_count(self.magnitude, "RandAugment: magnitude", 0, bins - 1)
        check_fill(self.fill, "RandAugment", per_channel=True)

    SPACE = "rand"

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        return draw_ops(self, seed, epoch, idx, stream, out_hw)


@dataclass(frozen=True)
class TrivialAugmentWide(Pixel):
    """One operation per sample from torchvision's wide table, at a magnitude bin drawn uniformly."""

    num_magnitude_bins: int = 31
    fill: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        check_count(self.num_magnitude_bins, "TrivialAugmentWide: num_magnitude_bins", 2, MAX_BINS)
        check_fill(self.fill, "TrivialAugmentWide", per_channel=True)

    SPACE = "wide"
    draw_stage = RandAugment.draw_stage


@dataclass(frozen=True)
class AutoAugment(Pixel):
    """One of the ``policy``'s 25 learned sub-policies per sample (``"imagenet"``, ``"cifar10"`` or
    ``"svhn"``): two operations, each applied with its own probability at its own magnitude."""

    policy: str = "imagenet"
    fill: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        # kept as its lower-case name: an enum member (torchvision's) writes back as text, so a
        # loader's state keeps it for a resumed epoch
        object.__setattr__(self, "policy", self.policy_name())
        check_fill(self.fill, "AutoAugment", per_channel=True)

    SPACE = "auto"
    draw_stage = RandAugment.draw_stage

    def policy_name(self) -> str:
        """The policy as a lower-case name (torchvision's ``AutoAugmentPolicy`` members work too)."""
        name = getattr(self.policy, "value", self.policy)
        if not isinstance(name, str) or name.lower() not in POLICIES:
            raise ValueError(f"AutoAugment: policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        return name.lower()
