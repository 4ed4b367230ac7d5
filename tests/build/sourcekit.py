"""The same images as every kind of source, for the build tests: Python datasets returning each image
type, a generator, Hugging Face Parquet files, WebDataset tars and a Pascal VOC folder.

The classes here are at module level so that the build's worker processes can unpickle them.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from cachekit.tools.synthetic_objects import make_object_dataset, object_classes

#: What a dataset's ``__getitem__`` gives as the image, per kind.
IMAGE_KINDS = ("bytes", "array", "pil", "tensor", "path")


@dataclass(frozen=True)
class Item:
    """One image of the object dataset and its targets, as its files state them."""

    file: str  # relative to the dataset's root
    path: str
    boxes: list  # COCO's [x, y, w, h]
    classes: list  # indices into object_classes
    mask: str  # the mask file
    text: str


def object_items(root: Path) -> list[Item]:
    """The images of ``make_object_dataset(root)`` in path order, with their boxes, masks and a caption."""
    coco = json.loads((root / "coco.json").read_text())
    items = []
    for e in sorted(coco["images"], key=lambda e: e["file_name"]):
        anns = [a for a in coco["annotations"] if a["image_id"] == e["id"]]
        items.append(
            Item(
                e["file_name"],
                str(root / e["file_name"]),
                [a["bbox"] for a in anns],
                [a["category_id"] - 10 for a in anns],
                str(root / "masks" / e["file_name"]),
                f"a photo, number {e['id']}",
            )
        )
    return items


def make_objects(root: Path, n: int = 8) -> tuple[Path, list[Item]]:
    root = make_object_dataset(root, n, size=(40, 52), classes=3)
    return root, object_items(root)


def _image(path: str, kind: str):
    if kind == "bytes":
        return Path(path).read_bytes()
    if kind == "path":
        return path
    rgb = cv2.imread(path, cv2.IMREAD_COLOR)[..., ::-1].copy()
    if kind == "array":
        return rgb
    if kind == "pil":
        from PIL import Image

        return Image.open(path)
    if kind == "tensor":
        import torch

        return torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
    raise ValueError(kind)


def target_of(item: Item) -> dict:
    return {
        "boxes": np.array(item.boxes, dtype=np.float64).reshape(-1, 4),
        "classes": np.array(item.classes, dtype=np.int64),
        "mask": cv2.imread(item.mask, cv2.IMREAD_UNCHANGED),
        "text": item.text,
    }


class ObjectDataset:
    """A torchvision-style detection dataset: ``(image, target)`` with the image as ``kind``."""

    classes = object_classes(3)

    def __init__(self, items: list[Item], kind: str = "bytes") -> None:
        self.items, self.kind = list(items), kind

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        item = self.items[i]
        return _image(item.path, self.kind), target_of(item)


def object_stream(items: list[Item]):
    """The same samples as a generator of dicts (no ``__len__``)."""
    for item in items:
        yield {"image": Path(item.path).read_bytes(), **target_of(item)}


def breaking(samples, at: int):
    """``samples`` until the ``at``-th, where the stream's server goes away (a ``ConnectionError``)."""
    for k, sample in enumerate(samples):
        if k == at:
            raise ConnectionError("the stream's server went away")
        yield sample


class TorchvisionDetection:
    """torchvision v2's detection targets: ``{"boxes": BoundingBoxes-like XYWH tensor, "labels": tensor}``."""

    classes = object_classes(3)

    def __init__(self, items: list[Item]) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        import torch

        item = self.items[i]
        boxes = TaggedBoxes(torch.tensor(item.boxes, dtype=torch.float32).reshape(-1, 4))
        return _image(item.path, "tensor"), {"boxes": boxes, "labels": torch.tensor(item.classes)}


class _Format:
    name = "XYWH"


class TaggedBoxes:
    """A tensor's stand-in that says its format, as torchvision's ``BoundingBoxes`` does."""

    format = _Format()

    def __init__(self, tensor) -> None:
        self.tensor = tensor

    def __array__(self, dtype=None, copy=None):
        return self.tensor.numpy() if dtype is None else self.tensor.numpy().astype(dtype)


class FileDataset:
    """A classification dataset of image files: ``(encoded bytes, class)``."""

    def __init__(self, files: list[str], classes: list[str]) -> None:
        self.files, self.classes = list(files), list(classes)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return Path(self.files[i]).read_bytes(), i % len(self.classes)


class LyingDataset:
    """Says it holds ``claimed`` samples, holds ``len(files)``; the rest raise IndexError."""

    def __init__(self, files: list[str], claimed: int) -> None:
        self.files, self.claimed = list(files), claimed

    def __len__(self) -> int:
        return self.claimed

    def __getitem__(self, i: int):
        return Path(self.files[i]).read_bytes(), 0

    classes = ["only"]


class BrokenAfter(LyingDataset):
    """Its first ``len(files)`` samples read; every later one raises."""

    def __getitem__(self, i: int):
        if i >= len(self.files):
            raise RuntimeError(f"the disk with sample {i} is gone")
        return Path(self.files[i]).read_bytes(), 0


class MixedDataset:
    """Samples of every wrong kind between good ones."""

    classes = ["a", "b"]

    def __init__(self, good: bytes) -> None:
        self.good = good

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        h = np.zeros((16, 20, 3), dtype=np.uint8)
        bad = {
            1: ("not an image", 0),
            2: (h.astype(np.float32), 0),
            3: (self.good, {"label": 0, "boxes": [[1, 1, float("nan"), 5]], "classes": [0]}),
            4: (self.good, {"label": "cat"}),
            5: (b"\x89PNG\r\n\x1a\n garbage", 1),
            6: (self.good, {"label": 1, "boxes": [[1, 2, 3]], "classes": [0]}),
        }
        if i in bad:
            return bad[i]
        return self.good, {"label": i % 2, "boxes": np.array([[1.0, 2.0, 9.0, 12.0]]), "classes": [1]}


def parquet_rows(items: list[Item]) -> list[dict]:
    return [
        {
            "image": {"bytes": Path(it.path).read_bytes(), "path": Path(it.path).name},
            "objects": {"bbox": it.boxes, "category": it.classes},
            "caption": it.text,
        }
        for it in items
    ]


def write_parquet(items: list[Item], folder: Path, files: int = 2, row_group: int = 3) -> str:
    """The items as Hugging Face Parquet files ``folder/train-0000k.parquet``; returns their glob."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    names = object_classes(3)
    features = {
        "image": {"_type": "Image"},
        "objects": {"feature": {"category": {"names": names, "_type": "ClassLabel"}}, "_type": "Sequence"},
        "caption": {"dtype": "string", "_type": "Value"},
    }
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    table = pa.Table.from_pylist(parquet_rows(items)).replace_schema_metadata(meta)
    per = -(-len(items) // files)
    for k in range(files):
        pq.write_table(table.slice(k * per, per), folder / f"train-{k:05d}.parquet", row_group_size=row_group)
    return str(folder / "train-*.parquet")


def add_member(tar: tarfile.TarFile, name: str, data: bytes, **info) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    for key, value in info.items():
        setattr(member, key, value)
    tar.addfile(member, io.BytesIO(data) if data else None)


def write_tars(items: list[Item], folder: Path, files: int = 2) -> str:
    """The items as WebDataset tars ``folder/train-00000k.tar`` (png, json, txt); returns the brace pattern."""
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(items) // files)
    for k in range(files):
        with tarfile.open(folder / f"train-{k:06d}.tar", "w") as tar:
            for it in items[k * per : (k + 1) * per]:
                key = Path(it.file).stem
                add_member(tar, f"{key}.png", Path(it.path).read_bytes())
                add_member(
                    tar, f"{key}.json", json.dumps({"boxes": it.boxes, "classes": it.classes}).encode()
                )
                add_member(tar, f"{key}.txt", it.text.encode())
    return str(folder / f"train-{{{0:06d}..{files - 1:06d}}}.tar")


def write_voc(items: list[Item], folder: Path, difficult: int = 0) -> Path:
    """The items as a Pascal VOC folder (Annotations/*.xml, JPEGImages/), boxes as VOC's 1-based
    pixel numbers (a box from x to x + w covers pixels x + 1 to x + w)."""
    (folder / "Annotations").mkdir(parents=True, exist_ok=True)
    (folder / "JPEGImages").mkdir(exist_ok=True)
    names = object_classes(3)
    for it in items:
        stem = Path(it.file).stem
        h, w = cv2.imread(it.path).shape[:2]
        (folder / "JPEGImages" / f"{stem}.png").write_bytes(Path(it.path).read_bytes())
        objects = "".join(
            f"<object><name>{names[c]}</name><difficult>{difficult}</difficult><bndbox><xmin>{x + 1}</xmin>"
            f"<ymin>{y + 1}</ymin><xmax>{x + bw}</xmax><ymax>{y + bh}</ymax></bndbox></object>"
            for (x, y, bw, bh), c in zip(it.boxes, it.classes)
        )
        (folder / "Annotations" / f"{stem}.xml").write_text(
            f"<annotation><filename>{stem}.png</filename><size><width>{w}</width><height>{h}</height>"
            f"<depth>3</depth></size>{objects}</annotation>"
        )
    return folder


class ClassesPast:
    """Two named classes; sample 3's class is past them, sample 4's past any integer a cache stores."""

    classes = ["a", "b"]

    def __init__(self, good: bytes) -> None:
        self.good = good

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return self.good, {3: 5, 4: 10**30}.get(i, i % 2)


class HugeView:
    """Sample 1 is a broadcast view claiming 50000x50000 pixels (no memory behind it): copied to
    contiguous RGB, it would take 7.5 GB."""

    classes = ["a"]

    def __init__(self, good: bytes) -> None:
        self.good = good

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int):
        if i == 1:
            return np.broadcast_to(np.zeros((1, 1, 1), dtype=np.uint8), (50_000, 50_000, 1)), 0
        return self.good, 0
