"""Class names a user fixes: ``--classes names.txt`` (one order for any source), ``--mask-classes``
(what a mask's values mean), and VOC's names for masks stored as VOC palette PNGs.

The same class gets the same index in every cache built with the same names file: a folder's
classes are sorted names, a multi-label CSV's sorted names, COCO's its categories in id order, a
YOLO ``data.yaml``'s its list; ``--classes`` maps each to its line in the file.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np

from ...errors import UsageError
from ...store.limits import MAX_CLASSES, short
from .labelscsv import read_text_file
from .layouts import NUMBERED, layout_named

__all__ = ["read_names_file", "with_class_order", "VOC_CLASSES", "voc_palette_names"]

#: PASCAL VOC's classes, in the order of its palette's indices (255 marks object edges: "void").
VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip


def read_names_file(path, what: str, most: int = MAX_CLASSES) -> tuple[str, ...]:
    """Class names from a text file, one a line in index order (blank lines and ``#`` comments left
    out), or given as a list or tuple of names; a repeated name or more than ``most`` of them is one
    line."""
    if isinstance(path, (list, tuple)):
        if not all(isinstance(n, str) and n.strip() for n in path):
            raise UsageError(
                f"{what} as a list takes class names (non-empty strings), got {short(list(path))}"
            )
        names = [n.strip() for n in path]
        path = short(names)
    else:
        text = read_text_file(path, what, 64 << 20, "a text file of class names, one a line")
        names = [
            line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
        ]
    if not names:
        raise UsageError(f"{what} {path} names no class (one name a line)")
    if len(names) > most:
        raise UsageError(f"{what} {path} names {len(names)} classes, over the {most} a cache may have")
    seen = set()
    for name in names:
        if name in seen:
            raise UsageError(f"{what} {path} names {name!r} twice")
        seen.add(name)
    return tuple(names)


def _yolo_numbers(source) -> bool:
    """A YOLO dataset without a data.yaml, or tars and Parquet files without class names: its classes
    are the numbers seen, named by their index (the names file names them in that order)."""
    row = layout_named(source.layout)
    return row is not None and row.class_names == NUMBERED and list(source.classes) == [str(i) for i in range(len(source.classes))]


def with_class_order(source, names: tuple[str, ...], path) -> object:
    """``source`` with its classes in the order of ``names`` (``--classes``): every class index it
    holds (each image's class, its boxes', its multi-labels) mapped to that name's line. A class the
    data has and the file does not name is one line; names the data lacks keep their index unused.
    A YOLO dataset without a data.yaml has numbers for classes: the file names them, in index order."""
    if _yolo_numbers(source):
        if len(source.classes) > len(names):
            raise UsageError(
                f"--classes {path} names {len(names)} classes; the {source.layout} source uses class "
                f"{len(source.classes) - 1}"
            )
        return replace(source, classes=tuple(names))
    index = {name: i for i, name in enumerate(names)}
    missing = [c for c in source.classes if c not in index]
    if missing:
        shown = ", ".join(repr(c) for c in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise UsageError(f"--classes {path} does not name {len(missing)} class(es) the data has: {shown}")
    remap = np.array([index[c] for c in source.classes] or [0], dtype=np.int64)
    labels = np.where(source.labels >= 0, remap[np.maximum(source.labels, 0)], source.labels)
    targets = tuple(_remapped(t, remap) for t in source.targets) if source.targets else source.targets
    reader = source.reader
    if hasattr(reader, "options") and hasattr(reader.options, "remap"):  # samples from code: read later
        reader = replace(reader, options=replace(reader.options, remap=tuple(remap.tolist())))
    return replace(source, classes=tuple(names), labels=labels, targets=targets, reader=reader)


def _remapped(target, remap: np.ndarray):
    """One raw target with its class indices through ``remap``: COCO's ``classes``, YOLO rows' first
    value, a multi-label list."""
    if not target:
        return target
    out = dict(target)
    if "classes" in out:
        out["classes"] = [int(remap[int(c)]) for c in out["classes"]]
    if "yolo" in out:
        out["yolo"] = [[float(remap[int(r[0])]), *r[1:]] for r in out["yolo"]]
    if "labels" in out and out["labels"] is not None:
        out["labels"] = sorted(int(remap[int(c)]) for c in out["labels"])
    return out


#: VOC's palette: index ``i``'s colour from the bits of ``i`` (as the devkit's ``labelcolormap``).
def _voc_colour(i: int) -> tuple[int, int, int]:
    r = g = b = 0
    for j in range(8):
        r |= ((i >> 0) & 1) << (7 - j)
        g |= ((i >> 1) & 1) << (7 - j)
        b |= ((i >> 2) & 1) << (7 - j)
        i >>= 3
    return r, g, b


def voc_palette_names(png: bytes) -> tuple[str, ...] | None:
    """VOC's class names when ``png`` is a palette PNG whose first 21 colours are VOC's, else None
    (only the chunks before the image data are read)."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    pos = 8
    while pos + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind == b"IHDR" and (len(png) < pos + 18 or png[pos + 17] != 3):  # colour type 3: palette
            return None
        if kind == b"PLTE":
            palette = png[pos + 8 : pos + 8 + length]
            want = b"".join(bytes(_voc_colour(i)) for i in range(len(VOC_CLASSES)))
            return VOC_CLASSES if palette[: len(want)] == want else None
        if kind == b"IDAT":
            return None
        pos += 12 + length
    return None
