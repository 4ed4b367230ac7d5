"""YOLO (Ultralytics) datasets (``--annotations yolo`` or ``--annotations data.yaml``): the images
under ``RAW/images/``, each with a ``RAW/labels/…/<name>.txt`` of ``class cx cy w h`` rows,
normalised to the image's width and height.

Class names come from ``data.yaml`` (``RAW/data.yaml``, or the file given) when there is one
(``names:`` as a list or an ``{id: name}`` map), else they are the numbers seen. An image without
a label file, or with an empty one, is kept with no boxes (a background image, as Ultralytics
treats it). A segmentation row (``class x1 y1 x2 y2 ...``, a polygon) gives the box round its
points. Bad rows (not numbers, NaN, a class outside the names, a box of no area or outside the
image, a labelled keypoint outside the image) are left out and reported, each with its file, line
and reason; boxes overhanging the image by rounding (under 0.1%) are clipped, and keypoints under
1% (Ultralytics' bound). Every row left out stops the build in one line, naming the ``kpt_shape``
the rows fit when one does (a data.yaml's ``[5, 3]`` for rows of 7 points: ``[7, 3]``).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

from ...errors import BuildError, UsageError
from ...store.fields import FieldSpec
from ...store.fields.keypoints import flip_problem
from ...store.limits import MAX_CLASSES
from .annotate import Tree, check_some_kept, keypoints_field, open_tree
from .inputtable import Source, nonempty, table
from .labelscsv import read_text_file
from .layouts import YOLO

__all__ = [
    "discover",
    "yolo_source",
    "load_data_yaml",
    "read_names",
    "read_pose",
    "parse_label_file",
    "label_path",
    "LABEL_FILE_MAX_BYTES",
    "MAX_UNNAMED_CLASSES",
]

#: A label file larger than this is not read (a line a box: a million boxes).
LABEL_FILE_MAX_BYTES = 64 << 20
#: Without a data.yaml the classes are the numbers seen (0 to the largest): a class index at or past
#: this is taken for a typo, its row left out and reported (name the classes in data.yaml for more).
MAX_UNNAMED_CLASSES = 10_000
_SLACK = 1e-3  # normalised coordinates this far past [0, 1] are rounding, and clipped
#: A labelled keypoint further past [0, 1] is pixels, or another image's: Ultralytics' own bound (its
#: label check refuses a file past 1.01); one within it is clipped onto the edge, still labelled.
_POINT_SLACK = 1e-2


def label_path(rel: str) -> str | None:
    """The label file of an image at ``images/…/x.jpg`` (relative to RAW): ``labels/…/x.txt``."""
    parts = rel.split("/")
    if len(parts) < 2 or parts[0] != "images":
        return None
    stem = parts[-1].rsplit(".", 1)[0]
    return "/".join(["labels", *parts[1:-1], f"{stem}.txt"])


def read_names(path: Path) -> list[str] | None:
    """Class names from a YOLO ``data.yaml``; None when it has none. A broken file: UsageError."""
    data = load_data_yaml(path)
    names = data.get("names") if isinstance(data, dict) else None
    if names is None:
        return None
    if isinstance(names, dict):
        if not all(isinstance(k, int) and not isinstance(k, bool) for k in names) or sorted(names) != list(
            range(len(names))
        ):
            raise UsageError(f"{path}: 'names' must map the ids 0, 1, 2, ... to names")
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, list) or not all(isinstance(n, (str, int, float)) for n in names):
        raise UsageError(f"{path}: 'names' must be a list of class names")
    return [str(n) for n in names]


def load_data_yaml(path: Path):
    """A ``data.yaml`` parsed (a regular UTF-8 file of at most 16 MiB; any YAML value), or a
    UsageError in one line: not valid YAML, or nested too deep for the parser."""
    import yaml

    text = read_text_file(path, "data.yaml", 16 << 20)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deep to be a data.yaml") from None


def read_pose(path: Path) -> tuple[tuple[int, int], list[int] | None] | None:
    """A pose dataset's ``kpt_shape`` ``(K, 2 or 3)`` and ``flip_idx`` from its data.yaml; None when
    it names no ``kpt_shape``. A shape or flip_idx that cannot be right: UsageError."""
    data = load_data_yaml(path)
    shape = data.get("kpt_shape") if isinstance(data, dict) else None
    if shape is None:
        return None
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in shape)
        or not 0 < shape[0] <= 1024
        or shape[1] not in (2, 3)
    ):
        raise UsageError(f"{path}: kpt_shape must be [K, 2] or [K, 3] (K points of x, y[, visibility])")
    flip = data.get("flip_idx")
    if flip is not None and (
        not isinstance(flip, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in flip)
    ):
        raise UsageError(f"{path}: flip_idx must list each of the {shape[0]} point indices once")
    problem = flip_problem(flip, shape[0]) if flip is not None else None
    if problem:  # a mirror swaps pairs: flip_idx [1, 2, 0] would turn a point into a third on every flip
        raise UsageError(
            f"{path}: flip_idx must list each of the {shape[0]} point indices once, swapped in pairs ({problem})"
        )
    return (shape[0], shape[1]), flip


def _pose_row(values: list[str], classes: int | None, kpt_shape: tuple[int, int]) -> tuple[list | None, str]:
    """A pose row ``class cx cy w h`` + K x (x, y[, v]) as ``[class, cx, cy, w, h, x, y, v, ...]``."""
    k, d = kpt_shape
    if len(values) != 5 + k * d:
        return (
            None,
            f"{len(values)} values: expected 'class cx cy w h' and {k} x {d} keypoint values (kpt_shape)",
        )
    row, why = _row(values[:5], classes)
    if row is None:
        return None, why
    try:
        numbers = [float(v) for v in values[5:]]
    except ValueError:
        return None, "a keypoint value that is not a number"
    if not all(math.isfinite(v) for v in numbers):
        return None, "a keypoint value that is not a finite number"
    points = []
    for j in range(k):
        x, y = numbers[j * d], numbers[j * d + 1]
        v = numbers[j * d + 2] if d == 3 else (0.0 if x < 0 or y < 0 else 1.0)  # Ultralytics' mask for 2-D
        if v not in (0, 1, 2):
            return None, f"a keypoint visibility of {v:g}, not 0, 1 or 2"
        if v and not (-_POINT_SLACK <= x <= 1 + _POINT_SLACK and -_POINT_SLACK <= y <= 1 + _POINT_SLACK):
            # pixels where normalised coordinates belong (Ultralytics refuses the file): reported, not
            # every point silently made unlabelled at the image's edge
            return None, (
                f"keypoint {j} ({x:g}, {y:g}) lies outside the image (normalised coordinates must lie in [0, 1])"
            )
        if v:  # past the edge by rounding: on it, still labelled
            x, y = min(max(x, 0.0), 1.0), min(max(y, 0.0), 1.0)
        points += [x, y, v]
    return row + points, ""


def _row(values: list[str], classes: int | None) -> tuple[list[float] | None, str]:
    """One label row as ``[class, cx, cy, w, h]`` (normalised), or None and why not."""
    if len(values) != 5 and (len(values) < 7 or len(values) % 2 == 0):
        return None, f"{len(values)} values: expected 'class cx cy w h' or a class and polygon points"
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        return None, "a value that is not a number"
    if not all(math.isfinite(v) for v in numbers):
        return None, "a value that is not a finite number"
    cls = numbers[0]
    if cls != int(cls) or cls < 0 or cls >= (classes if classes is not None else MAX_CLASSES):
        known = f" (data.yaml names {classes})" if classes is not None else ""
        return None, f"class {values[0]} is not a known class index{known}"
    if classes is None and cls >= MAX_UNNAMED_CLASSES:
        return None, (
            f"class {values[0]}: without a data.yaml naming the classes, indices stop at "
            f"{MAX_UNNAMED_CLASSES - 1} (a typo would make a class for every number below it)"
        )
    if len(values) == 5:
        cx, cy, w, h = numbers[1:]
        x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    else:
        xs, ys = numbers[1::2], numbers[2::2]
        x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
    if x2 - x1 <= 0 or y2 - y1 <= 0:
        return None, "a box of no area"
    if x1 < -_SLACK or y1 < -_SLACK or x2 > 1 + _SLACK or y2 > 1 + _SLACK:
        return None, "a box outside the image (normalised coordinates must lie in [0, 1])"
    x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, 1.0), min(y2, 1.0)
    return [int(cls), (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], ""


def parse_label_file(
    data: bytes, where: str, classes: int | None, kpt_shape: tuple[int, int] | None = None
) -> tuple[list[list[float]], list[tuple[str, str]]]:
    """The rows of one label file, and ``(where, reason)`` for each row left out. With a pose
    dataset's ``kpt_shape``, each row is followed by its K points as (x, y, visibility) triples."""
    rows, dropped = [], []
    try:
        text = data.decode("utf-8-sig")  # a BOM (Windows editors) is no part of line 1, as in Ultralytics
    except UnicodeDecodeError:
        return [], [(where, "not a UTF-8 text file")]
    for n, line in enumerate(text.splitlines(), 1):
        values = line.split()
        if not values:
            continue
        row, why = _row(values, classes) if kpt_shape is None else _pose_row(values, classes, kpt_shape)
        if row is None:
            dropped.append((where, f"line {n}: {why}"))
        else:
            rows.append(row)
    return rows, dropped


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _yolo_layout(root: str | Path, tree: Tree) -> tuple[str, Tree, callable, Path | None]:
    """Where the images and label files are: ``RAW/images/**`` with ``RAW/labels/**``, or RAW an
    ``images`` folder itself (``dataset/images/train``, one split) with its labels where Ultralytics
    looks for them, the last ``images`` in the path turned into ``labels``. Returns the images'
    folder under RAW, the labels' tree, an image's label path in it, and the dataset's root."""
    if tree.url or (Path(root) / "images").is_dir():
        return "images", tree, label_path, None if tree.url else Path(root)
    parts = Path(root).resolve().parts
    if "images" not in parts:
        raise UsageError(
            f"--annotations yolo expects the Ultralytics layout: {root}/images/ with the images and "
            f"{root}/labels/ with a .txt file per image, or RAW an images folder (dataset/images/train) "
            "with its labels in the matching labels folder (dataset/labels/train)"
        )
    k = len(parts) - 1 - parts[::-1].index("images")
    labels_root = Path(*parts[:k], "labels", *parts[k + 1 :])
    if not labels_root.is_dir():
        raise UsageError(f"--annotations yolo: no labels folder at {labels_root} for the images in {root}")
    return "", Tree(labels_root), lambda rel: f"{rel.rsplit('.', 1)[0]}.txt", Path(*parts[:k])


def yolo_source(root: str | Path, annotations: str, storage_options: dict | None = None) -> Source:
    """The images of a YOLO dataset, each with the boxes of its label file (``_yolo_layout``).

    A label file that is missing makes a background image (no boxes), as in Ultralytics; one that
    is there but cannot be used (not a regular file, unreadable, not UTF-8) leaves its image out,
    with the reason: its objects would otherwise be learnt as background.
    """
    tree = open_tree(root, storage_options)
    top, labels_tree, label_of, dataset = _yolo_layout(root, tree)
    yaml_path = Path(annotations) if annotations != YOLO.annotations else None
    if yaml_path is None and dataset is not None:
        yaml_path = next(
            (p for p in (Path(root) / "data.yaml", dataset / "data.yaml") if os.path.lexists(p)), None
        )
    names = read_names(yaml_path) if yaml_path is not None else None
    pose = read_pose(yaml_path) if yaml_path is not None else None
    kpt_shape = pose[0] if pose is not None else None
    images, ignored, unread = tree.images(top)
    labels = {rel: label_of(rel) for rel, *_ in images}
    stats = {lab: labels_tree.stat(lab) for lab in labels.values() if lab}
    texts = labels_tree.read_many(
        [lab for lab, st in stats.items() if not isinstance(st, str)], LABEL_FILE_MAX_BYTES
    )
    rows_of, dropped, seen, keep = {}, [], 0, []
    for rel, *_ in images:
        lab = labels[rel]
        st = stats.get(lab, "not found") if lab else "not found"
        data = texts.get(lab) if lab else None
        if isinstance(data, bytes) and not _utf8(data):
            data = "not UTF-8 text"
        if isinstance(st, str) and st != "not found" or isinstance(data, str):
            ignored.append((rel, f"its label file {lab}: {data if isinstance(data, str) else st}"))
            continue
        rows, bad = (
            parse_label_file(data, lab, len(names) if names else None, kpt_shape) if data else ([], [])
        )
        dropped += bad
        seen = max([seen, *(int(r[0]) + 1 for r in rows)])
        rows_of[rel] = {
            "yolo": [r[:5] for r in rows],
            "label_file": list(st) if not isinstance(st, str) else [0, 0],
        }
        if kpt_shape is not None:  # normalised (x, y, visibility) per point, per row
            rows_of[rel]["nkeypoints"] = [[r[j : j + 3] for j in range(5, len(r), 3)] for r in rows]
        keep.append((rel, -1, *_))
    if not images:
        raise UsageError(f"{root}{'/images' if top else ''} holds no images")
    if dropped and not any(r["yolo"] for r in rows_of.values()):
        _none_kept(
            labels_tree.root, yaml_path, texts.values(), len(names) if names else None, kpt_shape, dropped
        )
    classes = names if names is not None else [str(i) for i in range(seen)]
    source = table(root, YOLO.name, keep, classes, ignored, unread)
    targets = [rows_of[p] for p in source.paths]
    fields = {"boxes": FieldSpec("boxes")}
    if pose is not None:
        fields["keypoints"] = keypoints_field(None, None, pose[1], k=kpt_shape[0])
    return source.with_targets(fields, targets, dropped, {"annotations": YOLO.annotations})


#: The label rows read again to find the kpt_shape they fit, when none fitted.
_ROWS_TRIED = 10_000


def _none_kept(labels, yaml_path, texts, classes: int | None, kpt_shape, dropped) -> None:
    """Every label row was left out: a BuildError in one line, naming the kpt_shape the rows fit when
    one does (``_shapes_that_fit``), else the first row's reason (``check_some_kept``)."""
    rows = []
    for data in texts:
        if isinstance(data, bytes) and _utf8(data):
            rows += [v for v in (line.split() for line in data.decode("utf-8-sig").splitlines()) if v]
        if len(rows) >= _ROWS_TRIED:
            break
    held, fits = _shapes_that_fit(rows[:_ROWS_TRIED], classes, kpt_shape)
    if fits and kpt_shape is not None:
        raise BuildError(
            f"{yaml_path}: kpt_shape {list(kpt_shape)} fits no label row ({held}: {fits} would fit)"
        )
    check_some_kept(
        str(labels), 0, dropped, f"{held}: a data.yaml with {fits} would read them" if fits else ""
    )


def _shapes_that_fit(rows: list[list[str]], classes: int | None, given) -> tuple[str, str]:
    """What the label rows hold, from their commonest length (5 + K x D values), and the
    ``kpt_shape`` (``[K, 3]`` or ``[K, 2]``, other than ``given``) that reads the most of them, in
    words; both shapes when both read them (every third value a visibility 0 or 1, every value
    inside the image); ``("", "")`` when none does."""
    if not rows:
        return "", ""
    n = Counter(len(r) for r in rows).most_common(1)[0][0] - 5
    shapes = [(n // d, d) for d in (3, 2) if n > 0 and n % d == 0 and n // d <= 1024 and (n // d, d) != given]
    read = {s: sum(_pose_row(r, classes, s)[0] is not None for r in rows) for s in shapes}
    best = max(read.values(), default=0)
    fit = [s for s in shapes if best and read[s] == best]
    if not fit:
        return "", ""
    if len(fit) == 1:
        return f"rows hold {fit[0][0]} points of {fit[0][1]} values", f"kpt_shape: {list(fit[0])}"
    return f"rows hold {n} keypoint values", "kpt_shape: " + " or ".join(str(list(s)) for s in fit)


def discover(request) -> Source:
    """``base.SourceKind``: a YOLO dataset's images with their label files' boxes."""
    return nonempty(yolo_source(request.raw, str(request.annotations), request.storage_options))
