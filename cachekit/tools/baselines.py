"""The loaders a user would run without cachekit: raw files decoded every epoch, with PIL or OpenCV.

``RawImageDataset(inputs, backend="pil")`` is what torchvision's ``ImageFolder`` with
``Resize(256) + CenterCrop(224) + PILToTensor()`` does (torchvision itself is not needed);
``backend="opencv"`` runs a build's own decode and recipe on the raw file instead. Both return
``(uint8 tensor [3, H, W], label)`` like a CachedDataset, so the benchmark compares like with like.

With ``augment=(height, width)`` they are training loaders instead: PIL does what torchvision's
``RandomResizedCrop + RandomHorizontalFlip + PILToTensor`` does on the decoded file, OpenCV decodes
with a build's code and runs ``OpenCVRandomResizedCropFlip``, the per-sample ``transform=`` a user
writes for a CachedDataset. Both draw torchvision's crop parameters (``rrc_params``) from the
process's ``random`` state, which a DataLoader seeds in each worker.

A raw folder holds the same bad files for both loaders as for a build: ``check_raw_inputs`` reads and
decodes every input once through the build's own path (``build.shardjob``), so the raw rows load
exactly the inputs a build keeps and skip the others for the reasons a build records. Files a build
keeps but PIL cannot read are listed apart (``refused``), for the benchmark to leave out of every row.
"""

from __future__ import annotations

import io
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..build.shardjob import INPUT_ERRORS, decode_input, read_input, skip_reason
from ..build.sources.recordfiles import bytes_read
from ..errors import CachekitError, UsageError
from ..image.recipes import Pipeline
from .rawreads import RawReads, raw_source

__all__ = [
    "RawInputs",
    "RawImageDataset",
    "check_raw_inputs",
    "classification_recipe",
    "pil_classification",
    "pil_random_resized_crop_flip",
    "rrc_params",
    "OpenCVRandomResizedCropFlip",
    "BACKENDS",
]

BACKENDS = ("pil", "opencv")
#: torchvision's RandomResizedCrop defaults.
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3 / 4, 4 / 3)


def _pil_open(source):
    """A PIL image of a file, its bytes, or (a dataset's) decoded RGB pixels."""
    from PIL import Image

    return Image.fromarray(source) if isinstance(source, np.ndarray) else Image.open(source)


def pil_classification(
    path: str | os.PathLike | io.BytesIO | np.ndarray, resize: int, crop: int
) -> np.ndarray:
    """torchvision's ``default_loader`` + ``Resize(resize)`` + ``CenterCrop(crop)``, as ``[H, W, 3]`` uint8."""
    from PIL import Image

    with _pil_open(path) as opened:
        img = opened.convert("RGB")
    w, h = img.size
    if w <= h:
        size = (resize, int(resize * h / w))
    else:
        size = (int(resize * w / h), resize)
    img = img.resize(size, Image.BILINEAR)
    left, top = int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))
    img = img.crop((left, top, left + crop, top + crop))
    return np.asarray(img)


def rrc_params(
    height: int,
    width: int,
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
    rng: random.Random | None = None,
) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: ``(top, left, h, w)`` of a random box of
    ``scale`` x the area with aspect ``ratio``; after 10 misses, the central crop of the closest
    allowed aspect. Drawn from ``rng`` (default: the ``random`` module, seeded per DataLoader worker).
    """
    draw = random if rng is None else rng
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * draw.uniform(scale[0], scale[1])
        aspect = math.exp(draw.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return draw.randint(0, height - h), draw.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def pil_random_resized_crop_flip(
    path: str | os.PathLike | io.BytesIO | np.ndarray, size: tuple[int, int], p: float = 0.5
) -> np.ndarray:
    """torchvision's train transform on a raw file: ``default_loader``, ``RandomResizedCrop(size)``
    (crop, then a bilinear resize) and ``RandomHorizontalFlip(p)``, as ``[H, W, 3]`` uint8."""
    from PIL import Image

    with _pil_open(path) as opened:
        img = opened.convert("RGB")
    top, left, h, w = rrc_params(img.height, img.width)
    img = img.crop((left, top, left + w, top + h)).resize((size[1], size[0]), Image.BILINEAR)
    if random.random() < p:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img)


class OpenCVRandomResizedCropFlip:
    """What a user writes as a per-sample ``transform=``: torchvision's RandomResizedCrop parameters
    (``rrc_params``), one ``cv2.resize`` (bilinear), a random flip with probability ``p``.

    Called on a ``[C, H, W]`` uint8 tensor (a CachedDataset sample); ``crop_hwc`` does the same on
    an ``[H, W, C]`` array (a decoded raw file). ``size``: an int (square) or ``(height, width)``.
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = RRC_SCALE,
        ratio: tuple[float, float] = RRC_RATIO,
        p: float = 0.5,
    ) -> None:
        self.size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        self.scale, self.ratio, self.p = scale, ratio, p

    def crop_hwc(self, img: np.ndarray) -> np.ndarray:
        """A random resized crop of ``img`` ``[H, W, C]``, maybe flipped, as a new ``[h, w, C]`` array."""
        top, left, h, w = rrc_params(img.shape[0], img.shape[1], self.scale, self.ratio)
        crop = np.ascontiguousarray(img[top : top + h, left : left + w])
        out = cv2.resize(crop, (self.size[1], self.size[0]), interpolation=cv2.INTER_LINEAR)
        if out.ndim == 2:  # one channel: OpenCV drops the axis
            out = out[:, :, None]
        if random.random() < self.p:
            out = out[:, ::-1]
        return out

    def __call__(self, chw: torch.Tensor) -> torch.Tensor:
        out = self.crop_hwc(chw.numpy().transpose(1, 2, 0))
        return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return f"OpenCVRandomResizedCropFlip(size={self.size}, scale={self.scale}, ratio={self.ratio}, p={self.p})"


def _classification_sizes(pipeline: Pipeline) -> tuple[int, int] | None:
    """(resize, crop) when ``pipeline`` is the classification recipe the PIL loader reproduces."""
    steps = [(s.op, s.params) for s in pipeline.steps]
    if [op for op, _ in steps] != ["resize_shorter", "center_crop"]:
        return None
    return int(steps[0][1]["size"]), int(steps[1][1]["size"])


@dataclass(frozen=True)
class RawInputs:
    """The inputs of a raw folder that a build would keep, and those it would skip with their reasons."""

    root: Path
    pipeline: Pipeline
    paths: tuple[str, ...]  # inputs a build keeps, relative POSIX paths, in the build's sorted order
    labels: np.ndarray  # int64, one per kept input
    skipped: tuple[tuple[str, str], ...]  # (path, reason) as a build records them, discovery's included
    refused: tuple[tuple[str, str], ...]  # (path, reason): kept by a build, unreadable for PIL
    found: int  # image files discovery found: kept + skipped
    bytes: int  # size of the files the kept inputs are read from, each file once
    #: How each kept input is read (a file, or a record of Parquet, a tar or a dataset).
    reads: RawReads | None = None

    def __len__(self) -> int:
        return len(self.paths)


class _Check(Dataset):
    """Input ``i``'s (build's skip reason, PIL's refusal), each None when fine; run in DataLoader workers."""

    def __init__(self, reads: RawReads, pipeline: Pipeline, pil: bool) -> None:
        self.reads, self.pipeline, self.pil = reads, pipeline, pil

    def __len__(self) -> int:
        return len(self.reads.paths)

    def __getitem__(self, index: int) -> tuple[str | None, str | None]:
        try:
            data = self.reads.read(index)
            self.pipeline.apply(decode_input(data, self.pipeline))
        except INPUT_ERRORS as exc:
            return skip_reason(exc), None
        return None, (_pil_refuses(data) if self.pil and isinstance(data, bytes) else None)


def _pil_refuses(data: bytes) -> str | None:
    """Why PIL cannot read an image a build decodes, or None. Decoded at reduced size: a check only."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (64, 64))
            img.convert("RGB")
    except UnidentifiedImageError:
        return "PIL cannot identify it as an image (a build decodes it)"
    except Exception as exc:  # PIL raises many types (OSError, ValueError, SyntaxError, bomb errors)
        return f"PIL cannot read it (a build decodes it): {type(exc).__name__}: {exc}"
    return None


def classification_recipe(pipeline: Pipeline) -> bool:
    """True for recipes the PIL raw loader can run (a resize and a centre crop, or nothing)."""
    return _classification_sizes(pipeline) is not None


def check_raw_inputs(
    root: str | os.PathLike,
    pipeline: Pipeline,
    *,
    pil: bool = False,
    workers: int = 0,
    progress: bool = False,
    discover_options: dict | None = None,
) -> RawInputs:
    """Read and decode every input of ``root`` once, as a build would; return the usable ones.

    ``pil=True`` also lists the files a build decodes but PIL cannot read (``refused``), so that a
    PIL raw loader is never given one. ``workers`` processes share the work.
    """
    from tqdm import tqdm

    source = raw_source(root, discover_options)
    root = Path(root) if isinstance(root, (str, os.PathLike)) else Path(".")
    reads = RawReads(root, tuple(source.paths), tuple(source.targets), source.reader)
    loader = DataLoader(
        _Check(reads, pipeline, pil),
        batch_size=None,
        num_workers=min(workers, len(source)),
    )
    verdicts: list[tuple[str | None, str | None]] = []
    with tqdm(
        total=len(source), unit="img", desc="checking raw files", disable=not progress, leave=False
    ) as bar:
        for verdict in loader:
            verdicts.append(verdict)
            bar.update(1)
    keep = [i for i, (build, _) in enumerate(verdicts) if build is None]
    skipped = list(source.ignored) + [(p, b) for p, (b, _) in zip(source.paths, verdicts) if b is not None]
    return RawInputs(
        root=root,
        pipeline=pipeline,
        paths=tuple(source.paths[i] for i in keep),
        labels=np.asarray(source.labels, dtype=np.int64)[keep],
        skipped=tuple(skipped),
        refused=tuple((source.paths[i], verdicts[i][1]) for i in keep if verdicts[i][1] is not None),
        found=len(source) + len(source.ignored),
        bytes=bytes_read(source.sizes, source.targets if source.reader is not None else (), keep),
        reads=reads.subset(keep),
    )


class RawImageDataset(Dataset):
    """Decode-every-epoch dataset over the inputs a build keeps, in a build's order and labels.

    Index ``i`` is ``inputs.paths[i]``; the benchmark never asks the PIL loader for a refused one.
    Without ``augment`` each input goes through the recipe (PIL: the classification recipe only);
    with ``augment=(height, width)`` the decoded file gets a random resized crop to that size and a
    random flip instead, with PIL as torchvision does it or with OpenCV.
    """

    def __init__(
        self, inputs: RawInputs, *, backend: str = "pil", augment: tuple[int, int] | None = None
    ) -> None:
        if backend not in BACKENDS:
            raise UsageError(f"unknown raw backend {backend!r} (choose from {', '.join(BACKENDS)})")
        self.inputs = inputs
        self.paths = [str(inputs.root / p) for p in inputs.paths]
        self.labels = inputs.labels
        self.backend = backend
        self.pipeline = inputs.pipeline
        self.augment = augment
        self._opencv_augment = OpenCVRandomResizedCropFlip(augment) if augment else None
        sizes = _classification_sizes(self.pipeline)
        if backend == "pil" and sizes is None and augment is None:
            raise UsageError(
                f"the PIL raw loader implements the classification recipe only, not {self.pipeline.name!r}: "
                "use --raw-backends opencv"
            )
        self._resize, self._crop = sizes or (0, 0)

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, index: int) -> np.ndarray:
        """The preprocessed ``[H, W, 3]`` uint8 image of input ``index``.

        The inputs were checked when the benchmark started; one that fails now changed since.
        """
        source = self.paths[index]  # a file for PIL to open, or what a record holds
        if self.inputs.reads is not None and self.inputs.reads.reader is not None:
            data = self.inputs.reads.read(index)  # a row of Parquet, a tar member, a dataset's sample
            source = io.BytesIO(data) if isinstance(data, bytes) else data
        try:
            if self.backend == "pil":
                if self.augment:
                    return pil_random_resized_crop_flip(source, self.augment)
                return pil_classification(source, self._resize, self._crop)
            if isinstance(source, str):
                data = read_input(Path(source))
            image = decode_input(data, self.pipeline, listen=False)  # checked at the start
            if self._opencv_augment is not None:
                return self._opencv_augment.crop_hwc(image)
            return self.pipeline.apply(image)[0]
        except (*INPUT_ERRORS, ValueError) as exc:
            raise CachekitError(
                f"{self.paths[index]} changed while the benchmark ran ({skip_reason(exc)}); run it again"
            ) from None

    def files(self) -> list[Path]:
        """The files this loader reads (for the bench to drop from the page cache)."""
        return self.inputs.reads.files() if self.inputs.reads is not None else [Path(p) for p in self.paths]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(np.ascontiguousarray(self.load(index).transpose(2, 0, 1)))
        return image, int(self.labels[index])
