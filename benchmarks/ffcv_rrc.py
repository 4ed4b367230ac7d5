"""FFCV 1.0.2 on the images of a cachekit cache: RandomResizedCropRGBImageDecoder + RandomHorizontalFlip.

    python benchmarks/ffcv_rrc.py CACHE OUT.beton [--batch-size 256] [--epochs 3] [--threads 2]

Run by ``benchmarks/run.py ffcv --ffcv-python PY`` with an interpreter that has ffcv (its own venv:
``pip wheel --no-deps ffcv==1.0.2`` after ``apt-get install libturbojpeg0-dev libopencv-dev
pkg-config``, that wheel installed ``--no-deps``, then ``numba assertpy fastargs psutil
pytorch-pfn-extras terminaltables``, torch and this project). The images are written raw (no JPEG),
like the cache's pixels, so both sides crop and resize the same stored pixels. Prints the median
samples/s of the timed epochs as its last line.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np


def write_beton(cache: str, out: Path) -> int:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    from cachekit import CachedDataset

    ds = CachedDataset(cache)

    class HWC:
        def __len__(self) -> int:
            return len(ds)

        def __getitem__(self, i):
            image, label = ds[i]
            return np.ascontiguousarray(image.numpy().transpose(1, 2, 0)), label

    if not out.exists():
        writer = DatasetWriter(
            str(out),
            {"image": RGBImageField(write_mode="raw", max_resolution=512), "label": IntField()},
            num_workers=2,
        )
        writer.from_indexed_dataset(HWC())
    return len(ds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache")
    parser.add_argument("beton", type=Path)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor

    n = write_beton(args.cache, args.beton)
    loader = Loader(
        str(args.beton),
        batch_size=args.batch_size,
        num_workers=args.threads,
        order=OrderOption.RANDOM,
        os_cache=True,
        drop_last=False,
        pipelines={
            "image": [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor()],
            "label": [IntDecoder(), ToTensor()],
        },
    )
    for _ in loader:  # warm-up: numba compiles, the page cache fills
        pass
    rates = []
    for _ in range(args.epochs):
        t0, seen = time.perf_counter(), 0
        for images, _labels in loader:
            seen += len(images)
        rates.append(seen / (time.perf_counter() - t0))
    print(f"{statistics.median(rates):.1f} samples/s over {n} samples")


if __name__ == "__main__":
    main()
