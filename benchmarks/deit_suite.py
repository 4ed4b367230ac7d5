"""The DeiT recipe at read time: make_loader's batched plan against the same recipe per sample in worker processes.

deit    RandomResizedCrop(224) + flip + RandAugment(2, 9) + RandomErasing(0.25) + MixUp/CutMix from a
        train-256 pixel cache: ``make_loader(augment=[...])`` (threads in this process) vs a per-sample
        transform in a plain 2-worker DataLoader, the way torchvision runs it on PIL images (its PIL
        kernels: ``Image.resize``, ``ImageOps``, ``ImageEnhance``, ``Image.transform``), erasing on the
        uint8 tensor and MixUp/CutMix on each batch in the training loop; samples/s and CPU use.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from feed_suites import _interleaved, _train256
from registry import suite
from torch.utils.data import DataLoader

from cachekit import CachedDataset, collate_batch, make_loader
from cachekit.augment.autoaugment import GEOMETRIC_OPS, op_matrix, space_of
from cachekit.tools.baselines import rrc_params
from cachekit.transforms import (
    MixUpOrCutMix,
    RandAugment,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
)

DEIT = [
    RandomResizedCrop(224),
    RandomHorizontalFlip(),
    RandAugment(2, 9),
    RandomErasing(0.25),
    MixUpOrCutMix(),
]


class PILDeiT:
    """RandomResizedCrop + flip + RandAugment(2, 9) per sample on a PIL image, then RandomErasing(0.25)
    on its tensor: torchvision's transforms as its PIL kernels run them."""

    def __init__(self, size: int = 224) -> None:
        self.size = size
        self.space = space_of(RandAugment())

    def _op(self, img, name: str, m: float):
        from PIL import Image, ImageEnhance, ImageOps

        if name in GEOMETRIC_OPS:
            inverse = np.linalg.inv(np.vstack([op_matrix(name, m, img.height, img.width), [0, 0, 1]]))[:2]
            return img.transform(
                img.size, Image.AFFINE, tuple(inverse.reshape(-1)), Image.NEAREST, fillcolor=0
            )
        if name in ("Brightness", "Color", "Contrast", "Sharpness"):
            return getattr(ImageEnhance, name)(img).enhance(1.0 + m)
        if name == "Posterize":
            return ImageOps.posterize(img, int(m))
        if name == "Solarize":
            return ImageOps.solarize(img, 255.0 * m)
        if name == "AutoContrast":
            return ImageOps.autocontrast(img)
        if name == "Equalize":
            return ImageOps.equalize(img)
        return img

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from PIL import Image

        img = Image.fromarray(image.permute(1, 2, 0).numpy())
        top, left, h, w = rrc_params(img.height, img.width)
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + w, top + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        names = list(self.space)
        for _ in range(2):
            name = random.choice(names)
            fn, signed = self.space[name]
            values = fn(31, img.height, img.width)
            m = 0.0 if values is None else float(values[9]) * (-1 if signed and random.random() <= 0.5 else 1)
            img = self._op(img, name, m)
        out = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        if random.random() < 0.25:  # RandomErasing(0.25), torchvision's box search
            area = self.size * self.size
            for _ in range(10):
                target = area * random.uniform(0.02, 0.33)
                aspect = math.exp(random.uniform(math.log(0.3), math.log(3.3)))
                eh, ew = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
                if eh < self.size and ew < self.size:
                    i, j = random.randint(0, self.size - eh), random.randint(0, self.size - ew)
                    out[:, i : i + eh, j : j + ew] = 0
                    break
        return out


class MixedBatches:
    """A DataLoader whose batches go through MixUp or CutMix in the loop, as torchvision's docs show."""

    def __init__(self, loader, classes: int) -> None:
        self.loader, self.classes = loader, classes

    def __iter__(self):
        for images, labels in self.loader:
            lam = float(np.random.beta(1.0, 1.0))
            one = torch.nn.functional.one_hot(labels, self.classes).float()
            if random.random() < 0.5:
                images = (
                    (images.float() * lam + images.roll(1, 0).float() * (1 - lam)).round().to(torch.uint8)
                )
            else:
                h, w = images.shape[-2:]
                r = 0.5 * math.sqrt(1 - lam)
                cx, cy = random.randrange(w), random.randrange(h)
                x1, x2 = max(cx - int(r * w), 0), min(cx + int(r * w), w)
                y1, y2 = max(cy - int(r * h), 0), min(cy + int(r * h), h)
                images = images.clone()
                images[..., y1:y2, x1:x2] = images.roll(1, 0)[..., y1:y2, x1:x2]
                lam = 1 - (x2 - x1) * (y2 - y1) / (w * h)
            yield images, one * lam + one.roll(1, 0) * (1 - lam)


@suite
def deit(args, root):
    cache = _train256(args, root)
    ds = CachedDataset(cache)
    bs = args.batch_size
    per_sample = DataLoader(
        CachedDataset(cache, transform=PILDeiT(224)),
        bs,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        collate_fn=collate_batch,
    )
    baseline, ours = _interleaved(
        {
            "DataLoader(2 workers, PIL RRC + flip + RandAugment(2, 9) + erasing per sample, MixUp/CutMix per batch)": (
                MixedBatches(per_sample, len(ds.classes))
            ),
            "make_loader(augment=[RRC(224), flip, RandAugment(2, 9), RandomErasing(0.25), MixUpOrCutMix()])": (
                make_loader(ds, bs, augment=DEIT, threads=2)
            ),
        },
        args.repeats,
    )
    ratio = ours["ratio_to_first"]
    print(
        f"DeiT recipe, make_loader (2 threads) / per-sample in 2 workers: {ratio:.2f}x (median of per-round ratios)"
    )
    return {"rows": [ours, baseline], "ratio": ratio, "samples": len(ds)}
