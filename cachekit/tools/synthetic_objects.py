"""Synthetic detection and segmentation datasets: objects at known places, in every annotation format.

``make_object_dataset(root, n)`` writes ``root/images/*`` (photo-like grey backgrounds with filled,
non-overlapping rectangles, one saturated colour per class), and for the same objects: YOLO label files
(``root/labels/``), a ``data.yaml``, COCO instances (``root/coco.json``) and class-map masks
(``root/masks/images/*.png``, 0 for background, class + 1 inside an object). Used by tests (every
object can be found again by its colour after any transform) and by ``cachekit bench --synthetic``.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from .synthetic import synthetic_image

__all__ = ["OBJECT_COLOURS", "make_object_dataset", "object_classes"]

#: The flat RGB colour of each class's objects: far from each other and from a photo's greys.
OBJECT_COLOURS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255))


def object_classes(classes: int) -> list[str]:
    return [f"object_{c}" for c in range(classes)]


def _objects(
    rng: np.random.Generator, h: int, w: int, classes: int, most: int
) -> list[tuple[int, list[int]]]:
    """Up to ``most`` non-overlapping ``(class, [x1, y1, x2, y2])`` rectangles, whole pixels."""
    found: list[tuple[int, list[int]]] = []
    for _ in range(most * 4):
        if len(found) >= most:
            break
        bw, bh = (
            int(rng.integers(max(4, w // 12), max(5, w // 3))),
            int(rng.integers(max(4, h // 12), max(5, h // 3))),
        )
        x1, y1 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        box = [x1, y1, x1 + bw, y1 + bh]
        gap = 2  # a free band between objects, so colours never touch
        if all(box[0] >= b[2] + gap or box[2] + gap <= b[0] or box[1] >= b[3] + gap or box[3] + gap <= b[1]
               for _, b in found):  # fmt: skip
            found.append((int(rng.integers(0, classes)), box))
    return found


def make_object_dataset(
    root: str | Path,
    n: int,
    *,
    size: tuple[int, int] = (240, 320),
    classes: int = 3,
    most: int = 7,
    seed: int = 0,
    ext: str = ".png",
) -> Path:
    """Write ``n`` images with objects and their annotations in every format under ``root``."""
    if not 1 <= classes <= len(OBJECT_COLOURS):
        raise ValueError(f"classes must be between 1 and {len(OBJECT_COLOURS)}")
    root = Path(root)
    for folder in ("images", "labels", "masks/images"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    coco = {"images": [], "annotations": [], "categories": []}
    coco["categories"] = [{"id": 10 + c, "name": name} for c, name in enumerate(object_classes(classes))]
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        h = int(size[0] * rng.uniform(0.8, 1.2))
        w = int(size[1] * rng.uniform(0.8, 1.2))
        gray = cv2.cvtColor(synthetic_image(rng, h, w), cv2.COLOR_RGB2GRAY) // 2 + 64  # muted, no colour:
        img = np.repeat(gray[..., None], 3, axis=2)  # objects are told apart by hue, whatever the jitter
        mask = np.zeros((h, w), dtype=np.uint8)
        lines = []
        name = f"img_{i:05d}"
        coco["images"].append({"id": i + 1, "file_name": f"images/{name}{ext}", "width": w, "height": h})
        for cls, (x1, y1, x2, y2) in _objects(rng, h, w, classes, int(rng.integers(0, most + 1))):
            img[y1:y2, x1:x2] = OBJECT_COLOURS[cls]
            mask[y1:y2, x1:x2] = cls + 1
            lines.append(
                f"{cls} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}"
            )
            coco["annotations"].append(
                {"id": len(coco["annotations"]) + 1, "image_id": i + 1, "category_id": 10 + cls,
                 "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0}
            )  # fmt: skip
        params = [cv2.IMWRITE_JPEG_QUALITY, 95] if ext == ".jpg" else []
        cv2.imwrite(str(root / "images" / f"{name}{ext}"), img[..., ::-1], params)
        cv2.imwrite(str(root / "masks" / "images" / f"{name}.png"), mask)
        (root / "labels" / f"{name}.txt").write_text("".join(f"{line}\n" for line in lines))
    (root / "coco.json").write_text(json.dumps(coco))
    names = "\n".join(f"  {c}: {name}" for c, name in enumerate(object_classes(classes)))
    (root / "data.yaml").write_text(f"path: .\ntrain: images\nnames:\n{names}\n")
    return root
