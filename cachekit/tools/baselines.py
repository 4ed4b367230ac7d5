"""The loaders a user would run without cachekit: raw files decoded every epoch, with PIL or OpenCV.

``RawImageDataset(root, backend="pil")`` is what torchvision's ``ImageFolder`` with
``Resize(256) + CenterCrop(224) + PILToTensor()`` does (torchvision itself is not needed);
``backend="opencv"`` runs cachekit's own decode and recipe on the raw file instead. Both return
``(uint8 tensor [3, H, W], label)`` like a CachedDataset, so the benchmark compares like with like.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..build.sources import discover
from ..constants import DEFAULT_PIPELINE
from ..errors import UsageError
from ..image.recipes import load_pipeline

__all__ = ["RawImageDataset", "pil_classification", "BACKENDS"]

BACKENDS = ("pil", "opencv")


def pil_classification(path: str | os.PathLike, resize: int, crop: int) -> np.ndarray:
    """torchvision's ``default_loader`` + ``Resize(resize)`` + ``CenterCrop(crop)``, as ``[H, W, 3]`` uint8."""
    from PIL import Image

    with open(path, "rb") as fh:
        img = Image.open(fh).convert("RGB")
    w, h = img.size
    if w <= h:
        size = (resize, int(resize * h / w))
    else:
        size = (int(resize * w / h), resize)
    img = img.resize(size, Image.BILINEAR)
    left, top = int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))
    img = img.crop((left, top, left + crop, top + crop))
    return np.asarray(img)


class RawImageDataset(Dataset):
    """Decode-every-epoch dataset over a raw folder, in cachekit's input order and labels."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        backend: str = "pil",
        pipeline: str = DEFAULT_PIPELINE,
        size: int | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise UsageError(f"unknown raw backend {backend!r} (choose from {', '.join(BACKENDS)})")
        source = discover(root)
        self.root = Path(root)
        self.paths = [str(self.root / p) for p in source.paths]
        self.labels = np.asarray(source.labels, dtype=np.int64)
        self.backend = backend
        self.pipeline = load_pipeline(pipeline, size)
        steps = {s.op: s.params for s in self.pipeline.steps}
        if backend == "pil" and set(steps) != {"resize_shorter", "center_crop"}:
            raise UsageError("the PIL baseline implements the classification recipe only")
        self._resize = steps.get("resize_shorter", {}).get("size")
        self._crop = steps.get("center_crop", {}).get("size")

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, index: int) -> np.ndarray:
        """The preprocessed ``[H, W, 3]`` uint8 image of input ``index``."""
        path = self.paths[index]
        if self.backend == "pil":
            return pil_classification(path, self._resize, self._crop)
        from ..image.ops import decode

        with open(path, "rb") as fh:
            data = fh.read()
        return self.pipeline.apply(decode(data))[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(np.ascontiguousarray(self.load(index).transpose(2, 0, 1)))
        return image, int(self.labels[index])
