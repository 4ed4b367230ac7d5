"""Keypoints in ``cachekit preview``: each point a dot in its index's colour, so that left and right
(points a mirror swaps by ``flip_idx``) are told apart at a glance and a swap gone wrong shows, the
skeleton's lines in the object's class colour, and a legend of index (and name) -> colour."""

from __future__ import annotations

import colorsys
from collections.abc import Callable

import cv2
import numpy as np
import torch

__all__ = ["POINT_PALETTE", "point_colour", "draw_points", "legend_entries", "legend_height", "draw_legend"]

#: Keypoint colours (RGB) by index, far from each other, from white (the dots' ring) and from the
#: grid's dark grey: point k takes ``POINT_PALETTE[k]``; past them, hues a golden angle apart.
POINT_PALETTE = (
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
    (220, 190, 255),
    (170, 110, 40),
    (255, 250, 200),
    (128, 0, 0),
    (170, 255, 195),
    (128, 128, 0),
    (255, 215, 180),
    (0, 0, 128),
    (128, 128, 128),
)
_RADIUS = 3
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_LINE = 16  # pixels per line of the legend
_PAD = 6


def point_colour(k: int) -> tuple[int, int, int]:
    """The colour (RGB) of keypoint index ``k``."""
    if 0 <= k < len(POINT_PALETTE):
        return POINT_PALETTE[k]
    r, g, b = colorsys.hsv_to_rgb((k * 0.618033988749895) % 1.0, 0.85, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def _points(target: dict, skeletons: dict | None):
    """The keypoints values of a target, ``(field, [N, K, 3] float tensor)``: the fields ``skeletons``
    names (None: every float [N, K, 3] value; an array field of that shape is no points)."""
    for key, value in target.items():
        if skeletons is not None and key not in skeletons:
            continue
        if isinstance(value, torch.Tensor) and value.dim() == 3 and value.shape[-1] == 3:
            if value.is_floating_point():
                yield key, value


def draw_points(
    canvas: np.ndarray,
    target: dict,
    x0: int,
    y0: int,
    scale: float,
    skeletons: dict | None,
    class_colour: Callable[[int], tuple[int, int, int]],
) -> None:
    """Each object's labelled keypoints (visibility > 0) as dots in their index's colour, ringed
    white, joined by the field's skeleton (in the object's ``class_colour``) where both ends are
    labelled. ``skeletons``: each keypoints field's pairs of point indices (None: see ``_points``)."""
    for key, value in _points(target, skeletons):
        classes = torch.as_tensor(target.get("classes", torch.zeros(len(value), dtype=torch.int64)))
        for pts, k in zip(value.numpy().astype(np.float64), classes.numpy().reshape(-1).tolist()):
            xy = [(x0 + int(x * scale), y0 + int(y * scale)) for x, y in pts[:, :2]]
            seen = (pts[:, 2] > 0).tolist()
            for a, b in (skeletons or {}).get(key, []):
                if seen[a] and seen[b]:
                    cv2.line(canvas, xy[a], xy[b], class_colour(int(k)), 2)
            for index, (p, on) in enumerate(zip(xy, seen)):
                if on:
                    cv2.circle(canvas, p, _RADIUS, point_colour(index), -1, cv2.LINE_AA)
                    cv2.circle(canvas, p, _RADIUS, (255, 255, 255), 1, cv2.LINE_AA)


def legend_entries(fields: dict) -> list[tuple[int, str]]:
    """``(index, label)`` for every keypoint index of the keypoints fields (``{name: params}``, with
    ``k`` and optionally ``names``): the label is the index and its name, ``"1 left_eye"``, and the
    index its mirror takes when it has one other than itself, ``"1 left_eye <> 2"``."""
    entries: dict[int, str] = {}
    for params in fields.values():
        names = params.get("names") or []
        flip = params.get("flip_idx") or []
        for i in range(int(params.get("k", 0))):
            label = f"{i} {names[i]}" if i < len(names) else str(i)
            if i < len(flip) and flip[i] != i:
                label += f" <> {flip[i]}"
            entries.setdefault(i, label)
    return sorted(entries.items())


def _layout(entries: list[tuple[int, str]], width: int) -> list[tuple[int, int, int, str]]:
    """Where each entry goes: ``(line, x, index, label)``, left to right, wrapped at ``width``."""
    out, line, x = [], 0, _PAD
    for index, label in entries:
        (tw, _), _ = cv2.getTextSize(label, _FONT, 0.4, 1)
        step = 4 * _RADIUS + tw + 3 * _PAD
        if x > _PAD and x + step > width:
            line, x = line + 1, _PAD
        out.append((line, x, index, label))
        x += step
    return out


def legend_height(entries: list[tuple[int, str]], width: int) -> int:
    """The pixels the legend of ``entries`` takes under a grid ``width`` wide (0 with no entries)."""
    if not entries:
        return 0
    return (_layout(entries, width)[-1][0] + 1) * _LINE + _PAD


def draw_legend(canvas: np.ndarray, entries: list[tuple[int, str]], top: int) -> None:
    """The legend at ``top``: each index's dot (as drawn on the samples) and its label."""
    for line, x, index, label in _layout(entries, canvas.shape[1]):
        y = top + line * _LINE + _LINE // 2
        centre = (x + 2 * _RADIUS, y)
        cv2.circle(canvas, centre, 2 * _RADIUS, point_colour(index), -1, cv2.LINE_AA)
        cv2.circle(canvas, centre, 2 * _RADIUS, (255, 255, 255), 1, cv2.LINE_AA)
        cv2.putText(
            canvas, label, (x + 4 * _RADIUS + _PAD, y + 4), _FONT, 0.4, (255, 255, 255), 1, cv2.LINE_AA
        )
