"""Preprocessing recipes: TOML files naming a sequence of ``cachekit.image.ops`` steps with their parameters.

A recipe is data: its resolved form (name, size, steps) is recorded in the manifest and hashed into
the cache fingerprint. Built-in recipes are the TOML files of the top-level ``pipelines/`` folder, shipped in
the wheel; a user passes a path to their own.
Parameters may refer to the recipe's output side as ``"size"`` or ``"size*A/B"`` so ``--size``
rescales the whole recipe. Every resolved size is a whole number from 1 to ``MAX_SIDE``, checked
before any image is made.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import MAX_SIDE
from ..errors import UsageError
from . import ops
from .geometry import Affine

__all__ = [
    "Pipeline",
    "Step",
    "ExtraSpec",
    "load_pipeline",
    "builtin_pipelines",
    "builtin_recipe_text",
    "OPS",
    "check_param",
    "check_recorded",
]

#: Shape and dtype string (``"<f4"``) of a per-sample extra a step records; the manifest stores it.
ExtraSpec = tuple[tuple[int, ...], str]


@dataclass(frozen=True)
class OpDef:
    """A recipe step's implementation and the per-sample extras it records."""

    fn: Callable[..., Any]
    params: tuple[str, ...]
    extras: dict[str, ExtraSpec]


OPS: dict[str, OpDef] = {
    "resize_shorter": OpDef(ops.resize_shorter, ("size",), {}),
    "resize_longer": OpDef(ops.resize_longer, ("size",), {}),
    "center_crop": OpDef(ops.center_crop, ("size", "pad_value"), {}),
    "letterbox": OpDef(
        ops.letterbox,
        ("size", "pad_value"),
        {"scale": ((), "<f4"), "scale_xy": ((2,), "<f4"), "pad": ((2,), "<i4")},
    ),
}


def _shorter_hw(h: int, w: int, size: int, **_: Any) -> tuple[int, int]:
    return (size, max(1, int(size * w / h))) if h <= w else (max(1, int(size * h / w)), size)


def _longer_hw(h: int, w: int, size: int, **_: Any) -> tuple[int, int]:
    scale = size / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale))


#: Each op's output (height, width) for an input's: what ``Pipeline.peak_pixels`` follows.
_OUTPUT_HW: dict[str, Callable[..., tuple[int, int]]] = {
    "resize_shorter": _shorter_hw,
    "resize_longer": _longer_hw,
    "center_crop": lambda h, w, size, **_: (size, size),
    "letterbox": lambda h, w, size, **_: (size, size),
}


def _center_crop_map(h: int, w: int, size: int, **_: Any) -> Affine:
    pad_top, pad_left = max(0, size - h) // 2, max(0, size - w) // 2
    hp, wp = max(h, size), max(w, size)
    top, left = int(round((hp - size) / 2.0)), int(round((wp - size) / 2.0))
    return Affine(1.0, 1.0, float(pad_left - left), float(pad_top - top))


def _letterbox_map(h: int, w: int, size: int, **_: Any) -> Affine:
    nh, nw = _longer_hw(h, w, size)
    return Affine(nw / w, nh / h, float((size - nw) // 2), float((size - nh) // 2))


def _resize_map(out_hw: Callable[..., tuple[int, int]]) -> Callable[..., Affine]:
    def geometry(h: int, w: int, **params: Any) -> Affine:
        nh, nw = out_hw(h, w, **params)
        return Affine(nw / w, nh / h)

    return geometry


#: Each op as a map of coordinates (``cachekit.image.geometry``), for its input's (height, width):
#: what moves a sample's boxes and mask with its pixels.
_GEOMETRY: dict[str, Callable[..., Affine]] = {
    "resize_shorter": _resize_map(_shorter_hw),
    "resize_longer": _resize_map(_longer_hw),
    "center_crop": _center_crop_map,
    "letterbox": _letterbox_map,
}

_SIZE_EXPR = re.compile(r"^size(?:\*(\d+(?:\.\d+)?))?(?:/(\d+(?:\.\d+)?))?$")


@dataclass(frozen=True)
class Step:
    op: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Pipeline:
    """A resolved recipe: every parameter a concrete value."""

    name: str
    size: int | None
    steps: tuple[Step, ...]
    description: str = ""

    @property
    def extras(self) -> dict[str, ExtraSpec]:
        """Per-sample extras the recipe records: ``orig_size`` always, plus its steps' own."""
        out: dict[str, ExtraSpec] = {"orig_size": ((2,), "<i4")}
        for step in self.steps:
            out.update(OPS[step.op].extras)
        return out

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "size": self.size,
            "steps": [{"op": s.op, **s.params} for s in self.steps],
        }

    def peak_pixels(self, height: int, width: int) -> int:
        """The most pixels any image has while the recipe runs on a ``height`` x ``width`` input.

        Known from the sizes alone, so a build refuses an input whose intermediate image would be
        huge (a 65000 x 1 PNG resized to a shorter side of 256) before decoding it.
        """
        peak, (h, w) = height * width, (height, width)
        for step in self.steps:
            h, w = _OUTPUT_HW[step.op](h, w, **step.params)
            peak = max(peak, h * w)
        return peak

    def geometry(self, height: int, width: int) -> tuple[Affine, tuple[int, int]]:
        """Where the recipe moves a point of a ``height`` x ``width`` input, and its output size."""
        affine, (h, w) = Affine(), (height, width)
        for step in self.steps:
            affine = affine.then(_GEOMETRY[step.op](h, w, **step.params))
            h, w = _OUTPUT_HW[step.op](h, w, **step.params)
        return affine, (h, w)

    def apply(self, img: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run the steps on one decoded RGB image; return the image and its extras."""
        extras: dict[str, np.ndarray] = {"orig_size": np.array(img.shape[:2], dtype=np.int32)}
        for step in self.steps:
            result = OPS[step.op].fn(img, **step.params)
            if isinstance(result, tuple):
                img, more = result
                extras.update(more)
            else:
                img = result
        return img, extras


def _builtin_folder():
    """The built-in recipes: the TOML files of the top-level ``pipelines/`` folder of a checkout, which
    an installed wheel carries as ``cachekit/pipelines/`` (setup.py maps the one to the other)."""
    installed = resources.files("cachekit").joinpath("pipelines")
    if installed.is_dir() and any(p.name.endswith(".toml") for p in installed.iterdir()):
        return installed  # (a folder left behind without its recipes, a stale checkout's, is not them)
    return Path(__file__).resolve().parents[2] / "pipelines"


def builtin_pipelines() -> list[str]:
    """Names of the recipes shipped with cachekit."""
    folder = _builtin_folder()
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def builtin_recipe_text(name: str) -> str:
    """The TOML text of the built-in recipe ``name`` (a starting point for one's own)."""
    if name not in builtin_pipelines():
        raise UsageError(f"unknown pipeline {name!r} (built-in: {', '.join(builtin_pipelines())})")
    return _builtin_folder().joinpath(f"{name}.toml").read_text(encoding="utf-8")


#: Each parameter's allowed whole-number range (inclusive); checked before anything is allocated.
_PARAM_RANGE = {"size": (1, MAX_SIDE), "pad_value": (0, 255)}


def _resolve(value: Any, size: int, where: str) -> Any:
    if not isinstance(value, str):
        return value
    m = _SIZE_EXPR.match(value.replace(" ", ""))
    if not m:
        raise UsageError(f"{where}: {value!r} is not a number, 'size' or 'size*A/B'")
    top, bottom = float(m.group(1) or 1), float(m.group(2) or 1)
    if not (math.isfinite(top) and math.isfinite(bottom)) or top <= 0 or bottom <= 0:
        raise UsageError(f"{where}: {value!r}: A and B of 'size*A/B' must be positive, finite numbers")
    scaled = size * top / bottom
    if not scaled < 2**62:
        raise UsageError(f"{where}: {value!r} is {size}*{m.group(1)}/{m.group(2)}, far past any image")
    return int(round(scaled))


def check_param(op: str, key: str, value: Any) -> str | None:
    """Why ``value`` cannot be ``op``'s parameter ``key`` (a known op's), or None when it can."""
    if key not in OPS[op].params:
        return f"{op} takes {', '.join(OPS[op].params)}, not {key}"
    low, high = _PARAM_RANGE[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"{key} must be a whole number from {low} to {high}, got {value!r}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}... ({len(text)} characters)"


def check_recorded(pipeline: Any) -> str | None:
    """Why the ``pipeline`` a manifest records is not a resolved recipe, or None when it is."""
    if not isinstance(pipeline, dict):
        return "expected an object"
    if not isinstance(pipeline.get("name", ""), str):
        return f"name: expected a string, got {_short(pipeline.get('name'))}"
    size = pipeline.get("size")
    if size is not None and (
        isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIDE
    ):
        return f"size: expected a whole number from 1 to {MAX_SIDE} or null, got {_short(size)}"
    steps = pipeline.get("steps", [])
    if not isinstance(steps, list) or len(steps) > 64:
        return f"steps: expected a list of at most 64 steps, got {_short(steps)}"
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("op"), str) or step["op"] not in OPS:
            return f'steps[{i}]: expected {{"op": one of {", ".join(sorted(OPS))}, ...}}, got {_short(step)}'
        for key, value in step.items():
            problem = None if key == "op" else check_param(step["op"], key, value)
            if problem:
                return f"steps[{i}]: {problem}"
    return None


def _parse(recipe: dict, origin: str, size: int | None) -> Pipeline:
    name = recipe.get("name", Path(origin).stem)
    base_size = recipe.get("size")
    if base_size is not None and (
        isinstance(base_size, bool) or not isinstance(base_size, int) or not 1 <= base_size <= MAX_SIDE
    ):
        raise UsageError(f"{origin}: 'size' must be a whole number from 1 to {MAX_SIDE}")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIDE:
            raise UsageError(f"--size must be from 1 to {MAX_SIDE} pixels, got {size}")
        if base_size is None:
            raise UsageError(f"pipeline {name!r} has no output size, so --size does not apply")
        base_size = size
    steps = []
    for i, raw in enumerate(recipe.get("steps", [])):
        where = f"{origin}: step {i + 1}"
        if not isinstance(raw, dict) or "op" not in raw:
            raise UsageError(f"{where}: needs an 'op'")
        op = raw["op"]
        if op not in OPS:
            raise UsageError(f"{where}: unknown op {op!r} (known: {', '.join(sorted(OPS))})")
        unknown = set(raw) - {"op"} - set(OPS[op].params)
        if unknown:
            raise UsageError(
                f"{where}: {op} takes {', '.join(OPS[op].params)}, not {', '.join(sorted(unknown))}"
            )
        params = {k: _resolve(v, base_size or 0, f"{where}.{k}") for k, v in raw.items() if k != "op"}
        for key, value in params.items():
            problem = check_param(op, key, value)
            if problem:
                raise UsageError(f"{where}: {problem} (from {raw[key]!r})")
        steps.append(Step(op, params))
    return Pipeline(name=name, size=base_size, steps=tuple(steps), description=recipe.get("description", ""))


#: Largest recipe file read (a recipe is a few lines).
_MAX_RECIPE_BYTES = 1 << 20


def _recipe_text(path: Path) -> str:
    """The text of a recipe file: a regular UTF-8 file (never a FIFO, which would block), bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"pipeline file {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"pipeline file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"pipeline file {path} is not a regular file")
        data = os.read(fd, _MAX_RECIPE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"pipeline file {path} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_RECIPE_BYTES:
        raise UsageError(f"pipeline file {path} is over {_MAX_RECIPE_BYTES} bytes: not a recipe")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"pipeline file {path} is not UTF-8 text (byte {exc.start}): not a recipe") from None


def load_pipeline(name_or_path: str, size: int | None = None) -> Pipeline:
    """A built-in recipe by name, or a user's TOML file by path; ``size`` overrides its output side."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.is_file():
        origin, text = str(path), _recipe_text(path)
    elif name_or_path in builtin_pipelines():
        origin, text = name_or_path, builtin_recipe_text(name_or_path)
    else:
        known = ", ".join(builtin_pipelines())
        raise UsageError(f"unknown pipeline {name_or_path!r} (built-in: {known}; or a path to a .toml)")
    try:
        recipe = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{origin}: not valid TOML ({exc})") from None
    return _parse(recipe, origin, size)
