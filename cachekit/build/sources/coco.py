"""COCO instances annotations (``--annotations coco.json``): the images it lists, with their boxes.

Every image entry names a file relative to RAW (``file_name``) and its ``width`` and ``height``;
every annotation a ``bbox`` ``[x, y, w, h]`` in that image's pixels, a ``category_id`` and
``iscrowd``. Classes are the categories in id order (``ds.classes``: their names; the manifest
keeps their COCO ids). Images without annotations are kept, with no boxes.

Nothing in the file is trusted: it is size-checked before it is read, and every entry is checked
on its own. A bad image entry or annotation (a missing or duplicate id, a path outside RAW,
NaN or infinite numbers, a box of no area or outside its image, a labelled keypoint outside its
image, an unknown image or category) is left out and reported with its reason; a box or keypoint
that overhangs its image by less than a pixel (COCO has some) is clipped. Only a file that is not COCO JSON at all stops the build, in one line,
or a file whose every annotation is left out (``annotate.check_some_kept``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path, PurePosixPath
from typing import Any

from ...constants import MAX_ANNOTATIONS_BYTES
from ...errors import UsageError
from ...store.fields import FieldSpec
from ...store.fields.keypoints import MAX_KEYPOINTS
from ...store.limits import short
from .annotate import check_some_kept, keypoints_field, open_tree
from .inputtable import Source, nonempty, path_key, table
from .layouts import COCO

__all__ = ["CocoImages", "read_coco", "coco_source", "OVERHANG"]

#: How far (pixels) a box may reach past its image's edge and be clipped instead of dropped.
OVERHANG = 1.0


class CocoImages:
    """What a COCO file says: per image path, its size and boxes; the classes; what was left out."""

    def __init__(self) -> None:
        self.images: dict[
            str, dict
        ] = {}  # path -> {"size": [h, w], "boxes": [...], "classes": [...], "iscrowd": [...]}
        self.classes: list[str] = []
        self.category_ids: list[int] = []
        self.dropped: list[tuple[str, str]] = []  # (path or "annotations[i]", reason)
        #: COCO person keypoints: the points' names and skeleton (pairs from 0) of the categories
        #: that name them; each image's ``keypoints`` then holds ``[K, 3]`` per box (zeros: none).
        self.keypoint_names: list[str] | None = None
        #: category ids whose points were refused (another K, other names): their objects are kept,
        #: their points unlabelled, the category reported once
        self.unpointed: set[int] = set()
        self.skeleton: list[list[int]] | None = None


#: The keys of a COCO file cachekit reads; the rest (polygons, RLE masks, areas, captions, licences)
#: is dropped as each object is parsed, so a file costs about its own size in memory, not 8 times.
_KEYS = frozenset(
    ("images", "annotations", "categories", "id", "file_name", "width", "height", "image_id", "bbox",
     "category_id", "iscrowd", "name", "keypoints", "skeleton")
)  # fmt: skip


def _keep(obj: dict) -> dict:
    if len(obj) > 64 or not _KEYS.issuperset(obj):
        return {k: v for k, v in obj.items() if k in _KEYS}
    return obj


def _load(path: Path) -> dict:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise UsageError(f"annotations file {path}: cannot be read ({exc.strerror or exc})") from None
    if not path.is_file():
        raise UsageError(f"annotations file {path} is not a regular file")
    if size > MAX_ANNOTATIONS_BYTES:
        raise UsageError(
            f"annotations file {path} is {size / 2**20:,.0f} MiB, over the {MAX_ANNOTATIONS_BYTES / 2**20:,.0f} "
            "MiB limit (CACHEKIT_MAX_ANNOTATIONS_BYTES raises it)"
        )
    try:
        with open(path, "rb") as fh:
            obj = json.load(fh, object_hook=_keep)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise UsageError(f"annotations file {path}: not valid JSON ({short(str(exc))})") from None
    except RecursionError:
        raise UsageError(f"annotations file {path}: nested too deeply to be COCO annotations") from None
    except MemoryError:
        raise UsageError(f"annotations file {path}: too big to read into memory") from None
    except OSError as exc:
        raise UsageError(f"annotations file {path}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("images"), list):
        raise UsageError(f"annotations file {path}: not COCO annotations (no 'images' list)")
    for key in ("annotations", "categories"):
        if not isinstance(obj.get(key, []), list):
            raise UsageError(f"annotations file {path}: {key!r} is not a list")
    return obj


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**62 else None


def _relative(name: Any) -> str | None:
    """A ``file_name`` as a plain path inside RAW, or None."""
    if not isinstance(name, str) or not name or "\0" in name:
        return None
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return None
    return p.as_posix()


def _categories(obj: dict, found: CocoImages) -> dict[int, int]:
    """COCO category id -> class index (categories in id order)."""
    named = {}
    for i, cat in enumerate(obj.get("categories", [])):
        cid = _int(cat.get("id")) if isinstance(cat, dict) else None
        name = cat.get("name") if isinstance(cat, dict) else None
        if cid is None or not isinstance(name, str):
            found.dropped.append((f"categories[{i}]", "not a category (needs an integer id and a name)"))
        elif cid in named:
            found.dropped.append((f"categories[{i}]", f"category id {cid} is listed twice"))
        else:
            named[cid] = name
            if not _keypoint_names(cat, f"categories[{i}]", found):
                found.unpointed.add(cid)
    found.category_ids = sorted(named)
    found.classes = [named[c] for c in found.category_ids]
    return {c: i for i, c in enumerate(found.category_ids)}


def _keypoint_names(cat: dict, where: str, found: CocoImages) -> bool:
    """A keypoints category's point names and skeleton (COCO numbers points from 1) into ``found``;
    False when its points cannot be stored (reported): its objects are then kept without them."""
    names = cat.get("keypoints")
    if names is None:
        return True
    kept = " (its objects are kept without its points)"
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        found.dropped.append((where, "'keypoints' is not a list of point names" + kept))
        return False
    if len(names) > MAX_KEYPOINTS:
        found.dropped.append(
            (where, f"{len(names)} keypoints, past the {MAX_KEYPOINTS} a field holds" + kept)
        )
        return False
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:  # which point a name means, and its mirror's partner, would be a guess
        found.dropped.append((where, f"'keypoints' names the point {short(twice)} twice" + kept))
        return False
    if found.keypoint_names is not None and len(names) != len(found.keypoint_names):
        found.dropped.append(
            (where, f"{len(names)} keypoints, another category has {len(found.keypoint_names)}" + kept)
        )
        return False
    if found.keypoint_names is not None and names != found.keypoint_names:
        # one field, one meaning per index: another category's names and flip_idx would be its
        j = next(j for j, (a, b) in enumerate(zip(names, found.keypoint_names)) if a != b)
        found.dropped.append(
            (
                where,
                f"keypoint {j} is {short(names[j])}, another category's is {short(found.keypoint_names[j])}"
                + kept,
            )
        )
        return False
    edges = cat.get("skeleton") or []
    ok = isinstance(edges, list) and all(
        isinstance(e, list) and len(e) == 2 and all(_int(v) is not None and 1 <= v <= len(names) for v in e)
        for e in edges
    )
    if not ok:
        found.dropped.append(
            (where, f"skeleton {short(edges)} is not pairs of point numbers 1 to {len(names)}")
        )
    if found.keypoint_names is None:
        found.keypoint_names = list(names)
        found.skeleton = [[e[0] - 1, e[1] - 1] for e in edges] if ok else []
    return True


def _points(value: Any, k: int, h: int, w: int) -> tuple[list[list[float]] | None, str]:
    """An annotation's ``keypoints`` ``[x, y, v] x K`` as K triples, or None and why not: a labelled
    point (v 1 or 2) must lie in its ``h`` x ``w`` image (clipped onto it within ``OVERHANG``)."""
    if value is None:
        return [[0.0, 0.0, 0.0]] * k, ""  # an object of a category without points
    if not isinstance(value, list) or len(value) != 3 * k:
        return None, f"keypoints {short(value)} are not {k} x [x, y, v]"
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 2**53 and math.isfinite(v)
        for v in value
    ):
        return None, f"keypoints {short(value)} have a value that is not a finite number"
    triples = [[float(value[j]), float(value[j + 1]), float(value[j + 2])] for j in range(0, 3 * k, 3)]
    bad = next((t[2] for t in triples if t[2] not in (0, 1, 2)), None)
    if bad is not None:
        return None, f"a keypoint visibility of {bad:g}, not 0, 1 or 2"
    for j, t in enumerate(triples):
        if not t[2]:
            continue  # unlabelled: its x and y mean nothing
        if not (-OVERHANG <= t[0] <= w + OVERHANG and -OVERHANG <= t[1] <= h + OVERHANG):
            return None, f"keypoint {j} ({t[0]:g}, {t[1]:g}) lies outside its {w}x{h} image"
        t[0], t[1] = min(max(t[0], 0.0), float(w)), min(max(t[1], 0.0), float(h))
    return triples, ""


def _images(obj: dict, found: CocoImages) -> dict[int, str]:
    """COCO image id -> path, for every usable image entry."""
    by_id, paths = {}, set()
    for i, img in enumerate(obj["images"]):
        if not isinstance(img, dict):
            found.dropped.append((f"images[{i}]", "not an image entry"))
            continue
        iid, rel = _int(img.get("id")), _relative(img.get("file_name"))
        w, h = _int(img.get("width")), _int(img.get("height"))
        why = (
            "no integer id" if iid is None
            else "no file_name inside RAW" if rel is None
            else "no positive width and height" if not (w and h and w > 0 and h > 0)
            else f"image id {iid} is listed twice" if iid in by_id
            else f"{rel} is listed twice" if rel in paths
            else None
        )  # fmt: skip
        if why:
            found.dropped.append((rel or f"images[{i}]", why))
            continue
        by_id[iid] = rel
        paths.add(rel)
        found.images[rel] = {"size": [h, w], "boxes": [], "classes": [], "iscrowd": []}
    return by_id


def _box(bbox: Any, h: int, w: int) -> tuple[list[float] | None, str]:
    """``[x, y, w, h]`` as a clipped xyxy box, or None and why not."""
    if not isinstance(bbox, list) or len(bbox) != 4:
        return None, "bbox is not [x, y, width, height]"
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 2**53 and math.isfinite(v)
        for v in bbox
    ):
        return None, f"bbox {short(bbox)} has a value that is not a finite number (below 2**53)"
    x, y, bw, bh = (float(v) for v in bbox)
    if bw <= 0 or bh <= 0:
        return None, f"bbox {short(bbox)} has no area"
    x1, y1, x2, y2 = x, y, x + bw, y + bh
    if x1 < -OVERHANG or y1 < -OVERHANG or x2 > w + OVERHANG or y2 > h + OVERHANG:
        return None, f"bbox {short(bbox)} lies outside its {w}x{h} image"
    x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(w)), min(y2, float(h))
    if x2 <= x1 or y2 <= y1:
        return None, f"bbox {short(bbox)} has no area inside its image"
    return [x1, y1, x2, y2], ""


def read_coco(path: str | Path) -> CocoImages:
    """Parse and check a COCO instances file; a file that is not one is a UsageError (one line), one
    whose every annotation is left out a BuildError (``check_some_kept``)."""
    obj = _load(Path(path))
    found = CocoImages()
    category = _categories(obj, found)
    by_id = _images(obj, found)
    first = len(found.dropped)  # the annotations' own come next
    for i, ann in enumerate(obj.get("annotations", [])):
        where = f"annotations[{i}]"
        if not isinstance(ann, dict):
            found.dropped.append((where, "not an annotation"))
            continue
        rel = by_id.get(_int(ann.get("image_id")))
        if rel is None:
            found.dropped.append((where, f"unknown image_id {short(ann.get('image_id'))}"))
            continue
        cls = category.get(_int(ann.get("category_id")))
        if cls is None:
            found.dropped.append((rel, f"{where}: unknown category_id {short(ann.get('category_id'))}"))
            continue
        crowd = ann.get("iscrowd", 0)
        if crowd not in (0, 1) or isinstance(crowd, float):
            found.dropped.append((rel, f"{where}: iscrowd {short(crowd)} is not 0 or 1"))
            continue
        entry = found.images[rel]
        box, why = _box(ann.get("bbox"), *entry["size"])
        if box is None:
            found.dropped.append((rel, f"{where}: {why}"))
            continue
        if found.keypoint_names is not None:
            points, why = _points(
                None if _int(ann.get("category_id")) in found.unpointed else ann.get("keypoints"),
                len(found.keypoint_names),
                *entry["size"],
            )
            if points is None:
                found.dropped.append((rel, f"{where}: {why}"))
                continue
            entry.setdefault("keypoints", []).append(points)
        entry["boxes"].append(box)
        entry["classes"].append(cls)
        entry["iscrowd"].append(int(crowd))
    kept = sum(len(e["boxes"]) for e in found.images.values())
    check_some_kept(f"annotations file {path}", kept, found.dropped[first:])
    return found


def coco_source(root: str | Path, annotations: str | Path, storage_options: dict | None = None) -> Source:
    """The images a COCO file lists (those that exist in RAW), each with its boxes."""
    coco = read_coco(annotations)
    tree = open_tree(root, storage_options)
    rows, ignored, targets = [], [], {}
    for rel in sorted(coco.images, key=path_key):
        found = tree.stat(rel)
        if isinstance(found, str):
            ignored.append((rel, found))
            continue
        rows.append((rel, -1, *found))
        entry = coco.images[rel]
        targets[rel] = {"size": entry["size"], "boxes": entry["boxes"], "classes": entry["classes"],
                        "iscrowd": entry["iscrowd"]}  # fmt: skip
        if coco.keypoint_names is not None:
            targets[rel]["keypoints"] = entry.get("keypoints", [])
    source = table(root, COCO.name, rows, coco.classes, ignored, {})
    fields = {"boxes": FieldSpec("boxes")}
    if coco.keypoint_names is not None:
        fields["keypoints"] = keypoints_field(coco.keypoint_names, coco.skeleton)
    return source.with_targets(
        fields,
        [targets[p] for p in source.paths],
        coco.dropped,
        {"category_ids": coco.category_ids, "annotations": Path(annotations).name},
    )


def discover(request) -> Source:
    """``base.SourceKind``: the images ``--annotations``' COCO file lists, with their boxes."""
    return nonempty(coco_source(request.raw, request.annotations, request.storage_options))
