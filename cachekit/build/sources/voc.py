"""Pascal VOC (``--annotations voc``): ``RAW/Annotations/*.xml`` with the images in ``RAW/JPEGImages/``,
each object's box and class, ``difficult`` kept as the boxes' ``iscrowd`` flag.

XML is read as data: a file of bounded size, refused when it declares a DOCTYPE or an ENTITY (no
entity expansion, nothing fetched), parsed by ``xml.etree.ElementTree``. Boxes are the XML's
corners as written (VOC's pixel indices, as torchvision's ``VOCDetection`` gives them); a bad
object is left out and reported, a bad file leaves its image out with the reason; every object left
out stops the build in one line (``annotate.check_some_kept``).
"""

from __future__ import annotations

import math
import os
import posixpath
import xml.etree.ElementTree as ET
from xml.parsers import expat

from ...errors import UsageError
from ...store.fields import FieldSpec
from .annotate import check_some_kept, open_tree
from .inputtable import Source, nonempty, path_key, table
from .layouts import VOC

__all__ = ["discover", "voc_source", "parse_voc", "VOC_CLASSES", "MAX_XML_BYTES"]

#: The 20 classes of Pascal VOC, in their usual order (used when every name found is one of them).
VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
    "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip
#: Largest annotation file read (a VOC file is a few kB).
MAX_XML_BYTES = 1 << 20


def _number(node, tag: str) -> float:
    text = node.findtext(tag)
    value = float(text) if text is not None else math.nan
    if not math.isfinite(value):
        raise ValueError(f"<{tag}> is not a finite number")
    return value


_DECLARES = "declares a DOCTYPE or ENTITY (not read: entities are never expanded)"


def _refuse(*_args) -> None:
    raise ValueError(_DECLARES)


def _parse(data: bytes) -> ET.Element:
    """The XML's root, refusing any DOCTYPE or entity the parser meets (whatever the encoding: a
    UTF-16 file hides its declarations from a search of the bytes). The file is bounded, so a first
    pass of expat alone, which sees the declarations, costs little."""
    scan = expat.ParserCreate()
    scan.StartDoctypeDeclHandler = _refuse
    scan.EntityDeclHandler = _refuse
    scan.UnparsedEntityDeclHandler = _refuse
    scan.ExternalEntityRefHandler = _refuse
    try:
        scan.Parse(data, True)
    except expat.ExpatError as exc:
        raise ValueError(f"not XML ({exc})") from None
    return ET.fromstring(data)


def parse_voc(data: bytes, where: str) -> tuple[dict, list[tuple[str, str]]]:
    """One annotation file as ``{"file", "size", "objects": [(name, box, difficult)]}``, and the
    objects left out; ValueError (the reason) for a file that cannot be used."""
    if len(data) > MAX_XML_BYTES:
        raise ValueError(f"{len(data)} bytes, over the {MAX_XML_BYTES} an annotation file may have")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise ValueError(_DECLARES)
    try:
        root = _parse(data)
    except ET.ParseError as exc:
        raise ValueError(f"not XML ({exc})") from None
    if root.tag != "annotation":
        raise ValueError(f"the root element is <{root.tag}>, not <annotation>")
    name = (root.findtext("filename") or "").strip()
    size = root.find("size")
    if size is None:
        raise ValueError("no <size>")
    h, w = int(_number(size, "height")), int(_number(size, "width"))
    objects, dropped = [], []
    for k, obj in enumerate(root.iter("object")):
        label = (obj.findtext("name") or "").strip()
        box = obj.find("bndbox")
        try:
            if not label or box is None:
                raise ValueError("no <name> or <bndbox>")
            x1, y1, x2, y2 = (_number(box, t) for t in ("xmin", "ymin", "xmax", "ymax"))
            if x2 <= x1 or y2 <= y1:
                raise ValueError("a box of no area")
            if x1 < 0 or y1 < 0 or x2 > w + 1 or y2 > h + 1:
                raise ValueError(f"a box outside the {w}x{h} image")
        except ValueError as exc:
            dropped.append((f"{where} object {k}", str(exc)))
            continue
        difficult = (obj.findtext("difficult") or "0").strip() == "1"
        # VOC numbers pixels from 1 (the first pixel's xmin is 1): as continuous 0-based corners, the
        # box spans xmin - 1 to xmax, as every other source's boxes (detectron2 subtracts 1 too)
        objects.append((label, [max(x1 - 1, 0.0), max(y1 - 1, 0.0), min(x2, w), min(y2, h)], int(difficult)))
    return {"file": name, "size": [h, w], "objects": objects}, dropped


def voc_source(root, storage_options: dict | None = None) -> Source:
    """The images of a VOC folder that have an annotation file, each with its boxes."""
    tree = open_tree(root, storage_options)
    images = {rel for rel, *_ in tree.images("JPEGImages")[0]}  # to check the files' names against
    listed = _annotation_files(tree)
    if not listed:
        raise UsageError(f"--annotations voc: {root}/Annotations holds no .xml files")
    texts = tree.read_many(listed, MAX_XML_BYTES)
    entries, ignored, dropped = {}, [], []
    for rel in listed:
        data = texts.get(rel)
        try:
            if not isinstance(data, bytes):
                raise ValueError(data or "cannot be read")
            entry, bad = parse_voc(data, rel)
        except ValueError as exc:
            ignored.append((rel, str(exc)))
            continue
        stem = posixpath.splitext(posixpath.basename(rel))[0]
        image = f"JPEGImages/{entry['file'] or stem + '.jpg'}"
        if "/" in entry["file"] or entry["file"] in ("", ".", "..") or image not in images:
            image = next(
                (
                    f"JPEGImages/{stem}{e}"
                    for e in (".jpg", ".jpeg", ".png")
                    if f"JPEGImages/{stem}{e}" in images
                ),
                None,
            )
        if image is None:
            ignored.append((rel, "no image for it in JPEGImages/"))
            continue
        dropped += bad
        entries[image] = entry
    check_some_kept(f"{root}/Annotations", sum(len(e["objects"]) for e in entries.values()), dropped)
    names = sorted({o[0] for e in entries.values() for o in e["objects"]})
    classes = list(VOC_CLASSES) if set(names) <= set(VOC_CLASSES) else names
    index = {c: i for i, c in enumerate(classes)}
    rows, targets = [], {}
    for image in sorted(entries, key=path_key):
        found = tree.stat(image)
        if isinstance(found, str):
            ignored.append((image, found))
            continue
        e = entries[image]
        rows.append((image, -1, *found))
        targets[image] = {
            "size": e["size"],
            "boxes": [o[1] for o in e["objects"]],
            "classes": [index[o[0]] for o in e["objects"]],
            "iscrowd": [o[2] for o in e["objects"]],
        }
    source = table(root, VOC.name, rows, classes, ignored, {})
    return source.with_targets(
        {"boxes": FieldSpec("boxes")}, [targets[p] for p in source.paths], dropped, {"annotations": VOC.annotations}
    )


def _annotation_files(tree) -> list[str]:
    """The ``.xml`` files directly in ``Annotations/``."""
    if tree.url:
        return sorted(
            r
            for r in tree._files
            if r.startswith("Annotations/") and r.endswith(".xml") and r.count("/") == 1
        )
    folder = os.path.join(str(tree.root), "Annotations")
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.name.endswith(".xml") and e.is_file())
    except OSError as exc:
        raise UsageError(f"--annotations voc: {folder} cannot be listed ({exc.strerror or exc})") from None
    return [f"Annotations/{n}" for n in names]


def discover(request) -> Source:
    """``base.SourceKind``: Pascal VOC's annotated images with their boxes."""
    return nonempty(voc_source(request.raw, request.storage_options))
