"""The loaders a user would run without cachekit: raw files decoded every epoch, with PIL or OpenCV.

``RawImageDataset(inputs, backend="pil")`` is what torchvision's ``ImageFolder`` with
``Resize(256) + CenterCrop(224) + PILToTensor()`` does (torchvision itself is not needed);
``backend="opencv"`` runs a build's own decode and recipe on the raw file instead. Both return
``(uint8 tensor [3, H, W], label)`` like a CachedDataset, so the benchmark compares like with like.

A raw folder holds the same bad files for both loaders as for a build: ``check_raw_inputs`` reads and
decodes every input once through the build's own path (``build.shardjob``), so the raw rows load
exactly the inputs a build keeps and skip the others for the reasons a build records. Files a build
keeps but PIL cannot read are listed apart (``refused``), for the benchmark to leave out of every row.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..build.shardjob import INPUT_ERRORS, decode_input, read_input, skip_reason
from ..build.sources import discover
from ..errors import CachekitError, UsageError
from ..image.recipes import Pipeline

__all__ = ["RawInputs", "RawImageDataset", "check_raw_inputs", "pil_classification", "BACKENDS"]

BACKENDS = ("pil", "opencv")


def pil_classification(path: str | os.PathLike | io.BytesIO, resize: int, crop: int) -> np.ndarray:
    """torchvision's ``default_loader`` + ``Resize(resize)`` + ``CenterCrop(crop)``, as ``[H, W, 3]`` uint8."""
    from PIL import Image

    with Image.open(path) as opened:
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
    bytes: int  # size of the kept inputs' files

    def __len__(self) -> int:
        return len(self.paths)


class _Check(Dataset):
    """Input ``i``'s (build's skip reason, PIL's refusal), each None when fine; run in DataLoader workers."""

    def __init__(self, root: Path, paths: Sequence[str], pipeline: Pipeline, pil: bool) -> None:
        self.root, self.paths, self.pipeline, self.pil = root, paths, pipeline, pil

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[str | None, str | None]:
        try:
            data = read_input(self.root / self.paths[index])
            self.pipeline.apply(decode_input(data, self.pipeline))
        except INPUT_ERRORS as exc:
            return skip_reason(exc), None
        return None, (_pil_refuses(data) if self.pil else None)


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


def check_raw_inputs(
    root: str | os.PathLike,
    pipeline: Pipeline,
    *,
    pil: bool = False,
    workers: int = 0,
    progress: bool = False,
) -> RawInputs:
    """Read and decode every input of ``root`` once, as a build would; return the usable ones.

    ``pil=True`` also lists the files a build decodes but PIL cannot read (``refused``), so that a
    PIL raw loader is never given one. ``workers`` processes share the work.
    """
    from tqdm import tqdm

    source = discover(root)
    root = Path(root)
    loader = DataLoader(
        _Check(root, source.paths, pipeline, pil),
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
        bytes=int(np.asarray(source.sizes, dtype=np.int64)[keep].clip(min=0).sum()),
    )


class RawImageDataset(Dataset):
    """Decode-every-epoch dataset over the inputs a build keeps, in a build's order and labels.

    Index ``i`` is ``inputs.paths[i]``; the benchmark never asks the PIL loader for a refused one.
    """

    def __init__(self, inputs: RawInputs, *, backend: str = "pil") -> None:
        if backend not in BACKENDS:
            raise UsageError(f"unknown raw backend {backend!r} (choose from {', '.join(BACKENDS)})")
        self.inputs = inputs
        self.paths = [str(inputs.root / p) for p in inputs.paths]
        self.labels = inputs.labels
        self.backend = backend
        self.pipeline = inputs.pipeline
        sizes = _classification_sizes(self.pipeline)
        if backend == "pil" and sizes is None:
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
        path = self.paths[index]
        try:
            if self.backend == "pil":
                return pil_classification(path, self._resize, self._crop)
            return self.pipeline.apply(decode_input(read_input(Path(path)), self.pipeline))[0]
        except (*INPUT_ERRORS, ValueError) as exc:
            raise CachekitError(
                f"{path} changed while the benchmark ran ({skip_reason(exc)}); run it again"
            ) from None

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(np.ascontiguousarray(self.load(index).transpose(2, 0, 1)))
        return image, int(self.labels[index])
