"""``cachekit preview``: a grid of augmented samples as the model sees them, drawn with OpenCV into a PNG.

Samples are read through ``make_loader`` itself (the same plan, draws and collate a training run
gets), so what the grid shows is what training gets: boxes with their class names, masks as
coloured overlays, the class, several classes, soft labels (MixUp/CutMix: the two heaviest
classes with their weights) and captions under each image. No plotting library is needed.
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch

from ..augment.spec import parse_spec
from ..errors import UsageError
from ..feed.dataset import CachedDataset
from ..feed.loader import CacheLoader, make_loader
from .previewpoints import draw_legend, draw_points, legend_entries, legend_height

__all__ = ["PALETTE", "MAX_PREVIEW", "Cell", "Preview", "preview", "draw_grid", "short_spec", "caption_lines"]

#: Box and mask colours (RGB) by class, bright and far from each other; class k takes ``k % 10``.
PALETTE = (
    (255, 56, 56),
    (72, 249, 10),
    (0, 148, 255),
    (255, 178, 29),
    (207, 82, 255),
    (26, 218, 230),
    (255, 112, 31),
    (146, 204, 23),
    (255, 55, 199),
    (132, 56, 255),
)
#: The most samples one grid shows.
MAX_PREVIEW = 256
#: The longest side a grid may have, in pixels (a larger PNG is more than a person can look at).
MAX_GRID_SIDE = 16384
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_LINE = 16  # pixels per line of text under an image
_PAD = 6


@dataclass
class Cell:
    """Where sample ``index`` of a grid lies: its image's top left (``x``, ``y``) in the grid and
    the ``scale`` from the sample's pixels to the grid's; ``target`` as the loader gave it."""

    x: int
    y: int
    scale: float
    height: int
    width: int
    target: dict = field(default_factory=dict)


@dataclass
class Preview:
    """What ``preview`` drew: ``image`` (RGB ``[H, W, 3]`` uint8), written to ``path``; ``cells`` per sample."""

    path: Path | None
    image: np.ndarray
    cells: list[Cell]
    title: str
    legend: list[str] = field(default_factory=list)  # the keypoints' legend: "1 left_eye <> 2", ...


def _colour(k: int) -> tuple[int, int, int]:
    return PALETTE[int(k) % len(PALETTE)]


def _name(classes: list[str], k: int) -> str:
    return classes[k] if 0 <= k < len(classes) else str(k)


def _rows(batch) -> tuple[torch.Tensor, list[dict], torch.Tensor | None]:
    """A loader batch as (images, one target dict per sample, sizes of padded samples or None)."""
    images, targets, *rest = batch
    sizes = rest[0] if rest and isinstance(rest[0], torch.Tensor) else None
    n = len(images)
    if isinstance(targets, torch.Tensor):
        if targets.is_floating_point() and targets.dim() == 2:
            rows = [{"soft": targets[j]} for j in range(n)]  # MixUp / CutMix: weights over the classes
        elif targets.dim() == 2:  # multi-hot
            rows = [{"labels": torch.nonzero(targets[j]).flatten()} for j in range(n)]
        else:
            rows = [{"label": int(targets[j])} for j in range(n)]
    elif isinstance(targets, dict):  # stacked fields (masks, ...): one row each
        rows = [
            {k: v[j] if isinstance(v, (torch.Tensor, list)) else v for k, v in targets.items()}
            for j in range(n)
        ]
    else:
        rows = [t if isinstance(t, dict) else {"label": int(t)} for t in targets]
    return images, rows, sizes


def caption_lines(target: dict, classes: list[str], width: int) -> list[str]:
    """The words under an image: its class, classes, soft label and caption, wrapped to ``width`` pixels."""
    words = []
    soft = target.get("soft")
    if soft is not None:
        weights = torch.as_tensor(soft, dtype=torch.float32)
        top = torch.topk(weights, k=min(2, len(weights)))
        words.append(
            " + ".join(
                f"{_name(classes, int(k))} {float(w):.2f}" for w, k in zip(top.values, top.indices) if w > 0
            )
        )
    if "label" in target and not isinstance(target["label"], str):
        words.append(_name(classes, int(target["label"])))
    if "labels" in target:
        names = [_name(classes, int(k)) for k in torch.as_tensor(target["labels"]).flatten().tolist()]
        words.append(", ".join(names) if names else "(no labels)")
    for key, value in target.items():
        if isinstance(value, str):
            words.append(value if key in ("text", "caption") else f"{key}: {value}")
    chars = max(8, width // 7)  # ~7 pixels a character at the band's font size
    lines = []
    for text in words:
        lines += textwrap.wrap(text, chars, max_lines=3, placeholder="...") or [""]
    return lines


def _box_sets(target: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every boxes field of a target: (xyxy ``[N, 4]``, classes ``[N]``)."""
    found = []
    for key, value in target.items():
        if key.endswith("classes") or key.endswith("iscrowd") or not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 2 and value.shape[-1] == 4 and value.is_floating_point():
            classes_key = "classes" if key == "boxes" else f"{key}_classes"
            classes = target.get(classes_key, torch.zeros(len(value), dtype=torch.int64))
            found.append(
                (value.numpy().astype(np.float64), torch.as_tensor(classes).numpy().astype(np.int64))
            )
    return found


def _masks(target: dict, hw: tuple[int, int]) -> list[np.ndarray]:
    return [
        v.numpy()
        for k, v in target.items()
        if isinstance(v, torch.Tensor) and v.dim() == 2 and tuple(v.shape) == hw and not v.is_floating_point()
        and k not in ("boxes",)
    ]  # fmt: skip


def _tile(image: torch.Tensor, size: tuple[int, int] | None, target: dict, scale: float) -> np.ndarray:
    """One sample as RGB at ``scale``, its masks blended in (before scaling: nearest, as stored)."""
    x = image
    if size is not None:
        x = x[:, : int(size[0]), : int(size[1])]
    if x.is_floating_point():  # a dtype= loader's [0, 1], or [0, 255]
        x = (x * 255 if x.numel() and float(x.max()) <= 1.0 else x).clamp(0, 255).round()
    rgb = x.to(torch.uint8).permute(1, 2, 0).numpy()
    rgb = np.repeat(rgb, 3, axis=2) if rgb.shape[2] == 1 else np.ascontiguousarray(rgb[:, :, :3])
    for mask in _masks(target, rgb.shape[:2]):
        colours = np.array(
            [(0, 0, 0), *[_colour(k) for k in range(255)]], dtype=np.float32
        )  # value v: class v - 1
        overlay = colours[mask.astype(np.int64)]
        on = (mask > 0)[..., None]
        rgb = np.where(on, 0.55 * rgb + 0.45 * overlay, rgb).astype(np.uint8)
    h, w = rgb.shape[:2]
    out = (max(1, round(w * scale)), max(1, round(h * scale)))
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_NEAREST
    return cv2.resize(rgb, out, interpolation=interpolation) if out != (w, h) else rgb.copy()


def _text(canvas: np.ndarray, text: str, x: int, y: int, colour=(255, 255, 255), scale: float = 0.42) -> None:
    """``text`` with its baseline at ``y`` (on the grid's dark bands)."""
    cv2.putText(canvas, text, (x, y), _FONT, scale, colour, 1, cv2.LINE_AA)


def _boxes(canvas: np.ndarray, target: dict, classes: list[str], x0: int, y0: int, scale: float, hw) -> None:
    """Each box's rectangle in its class's colour, and its class name on a tag of that colour."""
    h, w = hw
    for boxes, labels in _box_sets(target):
        for (bx1, by1, bx2, by2), k in zip(boxes, labels):
            colour = _colour(k)
            p1 = (x0 + int(round(bx1 * scale)), y0 + int(round(by1 * scale)))
            p2 = (x0 + int(round(bx2 * scale)) - 1, y0 + int(round(by2 * scale)) - 1)
            cv2.rectangle(canvas, p1, p2, colour, 2)
            name = _name(classes, int(k))
            (tw, th), _ = cv2.getTextSize(name, _FONT, 0.4, 1)
            ty = p1[1] - 2 if p1[1] - th - 4 >= y0 else p1[1] + th + 4  # above the box, else inside it
            tx = min(p1[0], x0 + int(round(w * scale)) - tw - 2)
            cv2.rectangle(canvas, (tx, ty - th - 3), (tx + tw + 2, ty + 2), colour, -1)
            ink = (0, 0, 0) if sum(colour) > 380 else (255, 255, 255)
            cv2.putText(canvas, name, (tx + 1, ty - 1), _FONT, 0.4, ink, 1, cv2.LINE_AA)


def draw_grid(
    images: torch.Tensor,
    targets: list[dict],
    classes: list[str],
    *,
    sizes: torch.Tensor | None = None,
    title: str = "",
    cell: int = 256,
    columns: int | None = None,
    skeletons: dict | None = None,
    legend: list[tuple[int, str]] | None = None,
) -> tuple[np.ndarray, list[Cell]]:
    """A grid (RGB) of ``images [B, C, H, W]`` with their ``targets`` drawn, each image's longer side
    at ``cell`` pixels; padded samples cut to their ``sizes``. ``skeletons``: each keypoints field's
    pairs of points to join, the fields drawn as points (None: every float [N, K, 3] value), each
    point in its index's colour; ``legend``: ``(index, label)`` of those colours, drawn under the grid."""
    n = len(images)
    columns = min(columns or max(1, int(np.ceil(np.sqrt(n)))), max(1, n))  # no empty columns
    rows = -(-n // columns)
    hws = [tuple(int(v) for v in (sizes[j] if sizes is not None else images.shape[-2:])) for j in range(n)]
    scales = [cell / max(1, h, w) for h, w in hws]
    texts = [caption_lines(targets[j], classes, cell) for j in range(n)]
    band = _LINE * max((len(t) for t in texts), default=0) + (_PAD if any(texts) else 0)
    title_lines = textwrap.wrap(
        title, max(16, (columns * (cell + _PAD)) // 8), max_lines=4, placeholder="..."
    )
    head = _LINE * len(title_lines) + _PAD if title else 0
    width = columns * (cell + _PAD) + _PAD
    body = head + rows * (cell + band + _PAD) + _PAD
    canvas = np.full((body + legend_height(legend or [], width), width, 3), 32, np.uint8)
    draw_legend(canvas, legend or [], body)
    if title:
        for k, line in enumerate(title_lines):
            _text(canvas, line, _PAD, _LINE * (k + 1) + 4, scale=0.45)
    cells = []
    for j in range(n):
        r, c = divmod(j, columns)
        x0, y0 = _PAD + c * (cell + _PAD), head + _PAD + r * (cell + band + _PAD)
        tile = _tile(images[j], hws[j] if sizes is not None else None, targets[j], scales[j])
        th, tw = tile.shape[:2]
        canvas[y0 : y0 + th, x0 : x0 + tw] = tile
        _boxes(canvas, targets[j], classes, x0, y0, scales[j], hws[j])
        draw_points(canvas, targets[j], x0, y0, scales[j], skeletons, _colour)
        for k, line in enumerate(texts[j]):
            _text(canvas, line, x0 + 2, y0 + cell + _LINE * (k + 1) - 2)
        cells.append(Cell(x0, y0, scales[j], *hws[j], target=targets[j]))
    return canvas, cells


def short_spec(steps) -> str:
    """Transforms as a reader writes them: only the arguments that differ from the defaults."""
    parts = []
    for step in steps:
        if not dataclasses.is_dataclass(step):
            parts.append(type(step).__name__)
            continue
        shown = []
        for f in dataclasses.fields(step):
            value = getattr(step, f.name)
            if f.default is dataclasses.MISSING or value != f.default:
                text = repr(value)
                shown.append(text if not shown and f.default is dataclasses.MISSING else f"{f.name}={text}")
        parts.append(f"{type(step).__name__}({', '.join(shown)})")
    return ", ".join(parts)


def _plan_of(source, epoch: int | None) -> tuple[CachedDataset, list | None, int | None, int, float | None]:
    """(dataset, the loader's transforms for ``epoch`` (default: its next epoch), its seed, that
    epoch, the loader's min_visibility)."""
    if isinstance(source, CacheLoader):
        epoch = source.sampler.upcoming_epoch() if epoch is None else epoch
        plan = source.augment_for(epoch)
        seed = (source._request_options or {}).get("seed")
        steps = list(plan.listed) if plan is not None else None
        visibility = source.schedule.min_visibility if source.schedule is not None else None
        return source.dataset, steps, seed, epoch, visibility
    if isinstance(source, (str, os.PathLike)):
        return CachedDataset(source), None, None, 0 if epoch is None else epoch, None
    if hasattr(source, "read_request"):
        return source, None, None, 0 if epoch is None else epoch, None
    raise UsageError(
        f"preview takes a loader, a CachedDataset or a cache's path, not {type(source).__name__}"
    )


def _write_image(out: Path, grid: np.ndarray) -> None:
    """``grid`` (RGB) as ``out``'s format, whole or not at all: encoded first, written beside it, renamed
    over it, so a reader (an image viewer refreshing, a run killed half-way) never sees half a PNG."""
    ok, encoded = cv2.imencode(out.suffix.lower(), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
    if not ok:
        raise UsageError(f"could not encode {out.name} as {out.suffix}")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        tmp.write_bytes(encoded.tobytes())
        os.replace(tmp, out)
    except OSError as exc:
        raise UsageError(f"could not write {out} ({exc.strerror or exc}; is the folder writable?)") from None
    finally:
        tmp.unlink(missing_ok=True)


def preview(
    source,
    augment=None,
    n: int = 16,
    out: str | os.PathLike | None = "grid.png",
    seed: int | None = None,
    *,
    epoch: int | None = None,
    cell: int = 256,
    columns: int | None = None,
    min_visibility: float | None = None,
) -> Preview:
    """Draw ``n`` samples of ``source`` (a ``make_loader`` loader, a ``CachedDataset``, or a cache's
    path) as augmented by ``augment`` into a PNG at ``out`` (None: only returned).

    ``augment``: a list of ``cachekit.transforms`` or a spec (``"RandomResizedCrop(224),
    RandomHorizontalFlip()"``); default: a loader's own plan for its next epoch, else none. The
    samples are the first batch of epoch ``epoch`` (default: a loader's next, else 0) in the order
    of ``seed`` (default: a loader's, else 0), read by ``make_loader`` as a training run reads them;
    a loader's plan is the one of that epoch. A box keeping less than ``min_visibility`` of its area
    is dropped, as in training (default: a loader's own, else ``make_loader``'s default), whether the
    transforms are the loader's or ``augment``.
    """
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        raise UsageError(f"epoch must be an integer from 0, got {epoch!r}")
    dataset, steps, loader_seed, epoch, visibility = _plan_of(source, epoch)
    if isinstance(augment, str):
        augment = parse_spec(augment)
    if augment is not None:
        steps = list(augment) if isinstance(augment, (list, tuple)) else [augment]
    visibility = min_visibility if min_visibility is not None else visibility
    for name, value, low, high in (("n", n, 1, MAX_PREVIEW), ("cell", cell, 16, 2048)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UsageError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    if columns is not None and (
        isinstance(columns, bool) or not isinstance(columns, int) or not 1 <= columns <= MAX_PREVIEW
    ):
        raise UsageError(f"columns must be an integer from 1 to {MAX_PREVIEW}, got {columns!r}")
    seed = loader_seed if seed is None else seed
    seed = 0 if seed is None else seed
    if out is not None:
        out = Path(out)
        if out.suffix.lower() not in (".png", ".jpg", ".jpeg"):
            raise UsageError(f"--out must name a .png (or .jpg) file, got {str(out)!r}")
        if not out.parent.is_dir():
            raise UsageError(f"--out: no folder {str(out.parent)!r} to write {out.name} in")
    n = min(n, len(dataset))
    if n == 0:
        raise UsageError("the cache holds no samples to preview")
    across = min(columns or max(1, int(np.ceil(np.sqrt(n)))), n)
    side = max(across, -(-n // across)) * (cell + _PAD)
    if side > MAX_GRID_SIDE:  # 256 cells of 2048 px: a 3 GB canvas before any caption
        raise UsageError(
            f"a grid of {n} samples of {cell} px, {across} a row, is {side} px on a side, past the "
            f"{MAX_GRID_SIDE} a viewer opens: use a smaller --cell, fewer --samples or other --columns"
        )
    options = {"min_visibility": visibility} if visibility is not None else {}
    ragged = bool(getattr(dataset, "ragged", False))
    loader = make_loader(
        dataset,
        n,
        seed=seed,
        augment=steps or None,
        workers=0,
        prefetch_thread=False,
        pad=ragged and not steps,
        threads=1,
        distributed=False,  # every rank draws the same grid, without a collective
        **options,
    )
    loader.set_epoch(epoch)
    batch = next(iter(loader))
    images, targets, sizes = _rows(batch)
    where = getattr(dataset, "url", None) or Path(str(getattr(dataset, "root", "cache"))).name
    title = f"{where}, epoch {epoch}, seed {seed}: {short_spec(steps) if steps else 'no augmentation'}"
    points = {n: f.params for n, f in getattr(dataset, "fields", {}).items() if f.kind == "keypoints"}
    legend = legend_entries(points)
    grid, cells = draw_grid(
        images,
        targets,
        list(getattr(dataset, "classes", [])),
        sizes=sizes,
        title=title,
        cell=cell,
        columns=columns,
        skeletons={name: params.get("skeleton", []) for name, params in points.items()},
        legend=legend,
    )
    if out is not None:
        _write_image(out, grid)
    return Preview(out, grid, cells, title, [label for _, label in legend])
