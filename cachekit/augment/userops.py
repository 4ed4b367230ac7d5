"""The user's own ops beside the catalogue: ``PixelOp``, ``BatchOp`` and ``MatrixOp``, run on the fast path.

Each wraps a function of the user's and is one kind of step, so what it does to each target follows
from its kind: a ``PixelOp`` (``fn(image, rng) -> image`` on one sample's HWC uint8 array, a
``numpy.random.Generator`` from (seed, epoch, sample index)) and a ``BatchOp`` (``fn(images,
generator) -> images`` on the uint8 batch ``[B, C, H, W]``, a ``torch.Generator`` from (seed, epoch,
the batch's first sample)) move no target; a ``MatrixOp`` (``fn(height, width, rng) -> 3x3``, input
coordinates to output coordinates, continuous: pixel (row i, col j) covers [j, j+1) x [i, i+1)) is
composed into the sample's one map, so pixels, boxes and masks move with it. A function that raises,
or returns another shape or dtype, or a matrix that is not finite or not invertible, is refused in
one line naming the op and the sample. A loader's state names each op by its function's qualified
name (``spec_text``); a resumed loader must be given the same list.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..constants import MAX_SIDE
from .draws import keyed_generator, uniforms
from .opnames import op_name, said_in_one_line
from .protocol import BATCH, Batch, Geometric, Pixel
from .usage import AugmentUsageError

__all__ = [
    "PixelOp",
    "BatchOp",
    "MatrixOp",
    "USER_OPS",
    "BatchOpDraws",
    "PixelOpDraws",
    "op_name",
    "compile_batch_ops",
]

#: Streams of the batch ops start here (the list position is added; MixUp/CutMix use 3000).
BATCH_STREAM = 4000
#: A map whose condition number passes this is taken as singular (it would squash the image to a line).
MAX_CONDITION = 1e12


def _check_fn(fn, kind: str) -> None:
    if isinstance(fn, type) or not callable(fn):
        given = f"the class {fn.__name__}" if isinstance(fn, type) else type(fn).__name__
        raise TypeError(f"{kind} takes a function, not {given}: {kind}(my_function)")


def _failed(what: str, exc: BaseException, where: str) -> AugmentUsageError:
    return AugmentUsageError(f"augment: {what} raised {said_in_one_line(exc)} on {where}")


@dataclass(frozen=True, repr=False)
class PixelOp(Pixel):
    """``fn(image, rng) -> image``: one sample's HWC uint8 numpy array and a ``numpy.random.Generator``
    drawn from (seed, epoch, sample index); returns an array of the same shape and dtype. Runs per
    sample on the loader's threads after the geometry, in list order; moves no target. Not on the
    device path (write it as a ``BatchOp`` there)."""

    fn: Callable
    HOST_ONLY: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_fn(self.fn, "PixelOp")

    @property
    def name(self) -> str:
        return op_name(self.fn)

    def __repr__(self) -> str:
        return f"PixelOp({self.name})"

    def spec_text(self) -> str:
        return f"PixelOp({self.name!r})"

    def draw_stage(self, seed: int, epoch: int, idx: np.ndarray, stream: int, out_hw, stats=None) -> PixelOpDraws:
        """A batch's part of the per-sample stage (``cachekit.augment.stage``)."""
        return PixelOpDraws(self, seed, epoch, idx, stream)


@dataclass(frozen=True)
class PixelOpDraws:
    """A ``PixelOp`` over one batch: each row's generator from (seed, epoch, its index, stream)."""

    op: PixelOp
    seed: int
    epoch: int
    indices: np.ndarray
    stream: int

    def matrices(self, j: int) -> list:
        return []

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        index = int(self.indices[j])
        image = np.ascontiguousarray(chw.transpose(1, 2, 0))
        rng = keyed_generator(self.seed, self.epoch, index, self.stream)
        where = f"sample {index}"
        try:
            out = self.op.fn(image, rng)
        except Exception as exc:  # noqa: BLE001 -- whatever the user's function raises: one line
            raise _failed(repr(self.op), exc, where) from None
        if not isinstance(out, np.ndarray) or out.shape != image.shape or out.dtype != np.uint8:
            got = f"{out.dtype} {list(out.shape)}" if isinstance(out, np.ndarray) else _named(out)
            raise AugmentUsageError(
                f"augment: {self.op!r} returned {got} for {where}, not the uint8 {list(image.shape)} numpy image "
                "it was given (an op returns an image of the same shape and dtype)"
            )
        chw[...] = out.transpose(2, 0, 1)

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        raise AugmentUsageError(f"augment: {self.op!r} runs on CPU threads only: {_ON_DEVICE}")


_ON_DEVICE = "on the device path write it as BatchOp(fn) on the batch tensor, or pass augment_on='threads'"


@dataclass(frozen=True, repr=False)
class BatchOp(Batch):
    """``fn(images, generator) -> images`` on the uint8 batch ``[B, C, H, W]`` (torch) where it is:
    on the CPU after the per-sample stage (threads path), on the device (device path); ``generator``
    a ``torch.Generator`` on the batch's device seeded from (seed, epoch, the batch's first sample).
    Returns a uint8 tensor of the same shape; moves no target."""

    fn: Callable

    def __post_init__(self) -> None:
        _check_fn(self.fn, "BatchOp")

    @property
    def name(self) -> str:
        return op_name(self.fn)

    def __repr__(self) -> str:
        return f"BatchOp({self.name})"

    def spec_text(self) -> str:
        return f"BatchOp({self.name!r})"

    def generator(self, seed: int, epoch: int, first: int, stream: int, device) -> torch.Generator:
        bits = uniforms(seed, epoch, np.array([first]), stream, 1)[0, 0]
        generator = torch.Generator(device=device)
        generator.manual_seed(int(bits * 2.0**53))
        return generator

    def apply(self, images: torch.Tensor, seed: int, epoch: int, first: int, stream: int) -> torch.Tensor:
        """``fn`` on a uint8 batch, checked: a uint8 tensor of the same shape on the same device."""
        where = f"the batch starting at sample {first}"
        try:
            out = self.fn(images, self.generator(seed, epoch, first, stream, images.device))
        except Exception as exc:  # noqa: BLE001 -- whatever the user's function raises: one line
            raise _failed(repr(self), exc, where) from None
        if not isinstance(out, torch.Tensor) or out.shape != images.shape or out.dtype != torch.uint8:
            got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else _named(out)
            raise AugmentUsageError(
                f"augment: {self!r} returned {got} for {where}, not the uint8 {list(images.shape)} torch batch it "
                "was given (an op returns a batch of the same shape and dtype)"
            )
        if out.layout != torch.strided or out.device != images.device:
            fix = "it dense (.to_dense())" if out.device == images.device else f"its values on {images.device}"
            raise AugmentUsageError(
                f"augment: {self!r} returned {_tensor_kind(out)} for {where}, not a dense uint8 batch on "
                f"{images.device}, where it was given: return {fix}"
            )
        return out


@dataclass(frozen=True)
class BatchOpDraws:
    """A batch's ``BatchOp`` steps: ``before`` run ahead of MixUp/CutMix, ``after`` behind them (as
    listed), each ``(stream, op)``; ``first`` the batch's first sample."""

    before: tuple
    after: tuple
    seed: int
    epoch: int
    first: int

    def _run(self, ops, images: torch.Tensor) -> torch.Tensor:
        for stream, op in ops:
            images = op.apply(images, self.seed, self.epoch, self.first, stream)
        return images

    def apply_rows(self, out: np.ndarray, after: bool) -> None:
        """On a uint8 numpy batch ``[B, C, H, W]`` (the threads path), in place."""
        ops = self.after if after else self.before
        if not ops or not len(out):
            return
        images = torch.from_numpy(out)
        result = self._run(ops, images)
        if result.data_ptr() == images.data_ptr() and result.stride() == images.stride():
            return  # the batch itself, changed in place
        if result.untyped_storage().data_ptr() == images.untyped_storage().data_ptr():
            result = result.clone()  # another view of the batch (a transpose, an expand): read before written
        images.copy_(result)

    def apply_batch(self, x: torch.Tensor, after: bool) -> torch.Tensor:
        """On a float batch in [0, 255] (the device path): rounded to uint8 for the ops, float again."""
        ops = self.after if after else self.before
        if not ops or not len(x):
            return x
        return self._run(ops, x.round().clamp_(0, 255).to(torch.uint8)).to(x.dtype)


def _tensor_kind(t: torch.Tensor) -> str:
    """A tensor that holds no plain data where a batch was, in words: its layout and its device."""
    layout = "" if t.layout == torch.strided else f"{str(t.layout).removeprefix('torch.')} "
    where = "the meta device (shapes, no data)" if t.device.type == "meta" else str(t.device)
    return f"a {layout}tensor on {where}"


def _check_size(size) -> tuple[int, int] | None:
    if size is None:
        return None
    pair = (size, size) if isinstance(size, numbers.Integral) and not isinstance(size, bool) else size
    ok = (
        isinstance(pair, (tuple, list))
        and len(pair) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and 0 < v <= MAX_SIDE for v in pair)
    )
    if not ok:
        raise ValueError(f"MatrixOp: size must be (height, width) of sides 1-{MAX_SIDE}, or None, got {size!r}")
    return int(pair[0]), int(pair[1])


@dataclass(frozen=True, repr=False)
class MatrixOp(Geometric):
    """``fn(height, width, rng) -> 3x3`` float matrix from input to output coordinates (continuous:
    pixel (row i, col j) covers [j, j+1) x [i, i+1), as boxes do), ``rng`` a ``numpy.random.Generator``
    from (seed, epoch, sample index); the output is ``size`` (height, width), or the input's size.
    Composed with the list's other geometric steps into each sample's one map: pixels, boxes and
    masks move with it, on the threads and on the device."""

    fn: Callable
    size: tuple[int, int] | None = None
    GENERAL: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_fn(self.fn, "MatrixOp")
        object.__setattr__(self, "size", _check_size(self.size))

    @property
    def name(self) -> str:
        return op_name(self.fn)

    def __repr__(self) -> str:
        return f"MatrixOp({self.name})"

    def fixed_size(self, size):
        return self.size if self.size is not None else size

    def size_varies(self, varies: bool) -> bool:
        return False if self.size is not None else varies

    def spec_text(self) -> str:
        size = "" if self.size is None else f", size={self.size!r}"
        return f"MatrixOp({self.name!r}{size})"

    def draw_matrices(self, seed: int, epoch: int, idx: np.ndarray, stream: int, vh: np.ndarray, vw: np.ndarray):
        """``(maps [n, 3, 3], out heights, out widths)``: each sample's map from its view (``vh`` x
        ``vw``), checked finite and invertible."""
        n = len(idx)
        maps = np.empty((n, 3, 3), np.float64)
        for j in range(n):
            index = int(idx[j])
            h, w = int(vh[j]), int(vw[j])
            where = f"sample {index}"
            try:
                returned = self.fn(h, w, keyed_generator(seed, epoch, index, stream))
            except Exception as exc:  # noqa: BLE001 -- whatever the user's function raises: one line
                raise _failed(repr(self), exc, where) from None
            m = _real_matrix(returned)
            if m is None:
                raise AugmentUsageError(
                    f"augment: {self!r} returned {_described(returned)} for {where}, not a 3x3 matrix"
                )
            if not np.isfinite(m).all():
                raise AugmentUsageError(f"augment: {self!r} returned a matrix with NaN or inf for {where}")
            if not _conditioned(m):
                out_hw = self.size if self.size is not None else (h, w)
                raise AugmentUsageError(f"augment: {self!r} returned {_ill(m, where, (h, w), out_hw)}")
            maps[j] = m
        if self.size is None:
            return maps, vh, vw
        return maps, np.full(n, float(self.size[0])), np.full(n, float(self.size[1]))


def _conditioned(m: np.ndarray) -> bool:
    """Whether ``m``'s condition number is finite and at most ``MAX_CONDITION``."""
    c = np.linalg.cond(m)
    return math.isfinite(c) and c <= MAX_CONDITION


def _ill(m: np.ndarray, where: str, in_hw: tuple[int, int], out_hw: tuple[int, int]) -> str:
    """What a finite map taken as singular (its condition number past ``MAX_CONDITION``) does, for
    its refusal: a shift or a scale past any output it could show, or a squash onto a line."""
    linear = m.copy()
    linear[:2, 2] = 0.0
    affine = np.array_equal(m[2], (0.0, 0.0, 1.0))
    if affine and _conditioned(linear):  # the shift alone: the homogeneous column dwarfs the rest
        shift = float(np.abs(m[:2, 2]).max())
        return (
            f"a matrix for {where} that moves the image by {shift:g} pixels, past any output it could show: "
            "keep its translation near the image's size"
        )
    s = np.linalg.svd(m[:2, :2], compute_uv=False)  # its scales along its two axes, largest first
    if affine and s[1] > 0 and s[0] / s[1] <= MAX_CONDITION:
        if s[1] > 1:  # every axis enlarged: an output shows a sliver of one input pixel
            shown = " x ".join(f"{v / s[1]:.3g}" for v in out_hw)
            what = f"enlarges the image {s[1]:g} times (its {out_hw[0]} x {out_hw[1]} output shows {shown} pixels)"
        else:  # every axis shrunk: the whole image falls inside a fraction of a pixel
            shown = " x ".join(f"{v * s[0]:.3g}" for v in in_hw)
            what = f"shrinks the image {1 / s[0]:g} times (its {in_hw[0]} x {in_hw[1]} pixels become {shown})"
        return (
            f"a matrix for {where} that {what}, past the {MAX_CONDITION:g} times a map may scale by: keep its "
            "scale near the output's size over the image's"
        )
    return (
        f"a singular matrix for {where} (it squashes the image onto a line or a point): return an invertible map"
    )


def _named(value) -> str:
    """What an op returned, by its type (``None``, ``a torch.Tensor``), for its refusal."""
    if value is None:
        return "None"
    module = type(value).__module__.split(".")[0]
    return f"a {'' if module == 'builtins' else module + '.'}{type(value).__name__}"


def _array(value) -> np.ndarray | None:
    """``value`` as a numpy array (a list of rows, a tensor), or None where it is none (uneven rows)."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _real_matrix(value) -> np.ndarray | None:
    """``value`` as a float64 3x3 matrix, or None unless it is one of real numbers (a complex
    matrix is not cast to its real part)."""
    m = _array(value)
    if m is None or m.shape != (3, 3) or m.dtype.kind not in "biuf":
        return None
    return m.astype(np.float64)


def _described(value) -> str:
    """What a ``MatrixOp``'s function returned instead of a 3x3 matrix, for its refusal."""
    if value is None:
        return "None"
    m = _array(value)
    if m is None or m.dtype.kind not in "biufc":
        uneven = m is None and isinstance(value, (list, tuple))
        return f"a {type(value).__name__}" + (" of uneven rows" if uneven else "")
    kind = "" if m.dtype.kind in "biuf" else f"{m.dtype} "
    return f"a {kind}{list(m.shape)} array"


def compile_batch_ops(steps) -> tuple:
    """The ``BatchOp`` steps of a list: ``(stream, op, after_mix)``, after_mix when listed after the
    first of MixUp / CutMix (the other batch steps)."""
    mixes = [k for k, s in enumerate(steps) if s.KIND == BATCH and not isinstance(s, BatchOp)]
    return tuple(
        (BATCH_STREAM + k, s, bool(mixes) and k > mixes[0]) for k, s in enumerate(steps) if isinstance(s, BatchOp)
    )


#: The user's op classes, by name (the spec parser reads them back from a loader's state).
USER_OPS = (PixelOp, BatchOp, MatrixOp)
