"""Train a small detector the way YOLO trains: mosaic, affine, HSV and flips, mosaic closed for the last epochs.

    cachekit build raw/ --out cache/det --annotations yolo --pipeline max-side-512 --size 640
    python examples/train_yolo.py cache/det [--epochs 10] [--close-mosaic 2] [--size 320]
    python examples/train_yolo.py --synthetic 64 --epochs 4 --size 128     # no data needed: seconds

Every batch is composed on the loader's threads (on the GPU's side stream when there is one) as
Ultralytics' defaults do it: ``Mosaic`` puts four samples around a random centre, ``RandomAffine``
moves and scales the result, ``RandomHSV`` shifts its colours and ``RandomHorizontalFlip`` mirrors
it half the time, the boxes moving with the pixels. For the last ``--close-mosaic`` epochs
``loader.set_augment`` swaps mosaic for a plain letterbox (Ultralytics' ``close_mosaic``): it takes
effect when the next epoch begins, and batches read ahead keep the plan of their own epoch.
``--preview grid.png`` draws the first batch with its boxes, as Ultralytics' ``train_batch0.jpg``.
The model and loss are ``train_detection.py``'s grid detector, so the example runs anywhere.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from train_detection import GridDetector, detection_loss

import cachekit
from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.tools.synthetic_objects import make_object_dataset


def recipes(size: int) -> tuple[list, list]:
    """(with mosaic, without): Ultralytics' default augmentation, and what close_mosaic leaves of it."""
    from cachekit.transforms import Letterbox, Mosaic, RandomAffine, RandomHorizontalFlip, RandomHSV

    rest = [
        RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5), fill=114),
        RandomHSV(h=0.015, s=0.7, v=0.4),
        RandomHorizontalFlip(),
    ]
    return [Mosaic(size), *rest], [Letterbox(size), *rest]


def synthetic_cache(n: int, folder: Path) -> Path:
    """``n`` images of coloured objects with YOLO labels, built into a detection cache."""
    raw = make_object_dataset(folder / "raw", n, size=(240, 320), classes=3, most=6)
    cache = folder / "cache"
    build(raw, cache, BuildConfig(annotations="yolo", pipeline="max-side-512", size=320, workers=1,
                                  progress=False))  # fmt: skip
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", nargs="?", help="a detection cache (default: --synthetic)")
    parser.add_argument("--synthetic", type=int, default=None, help="train on N synthetic images instead")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--close-mosaic", type=int, default=2, help="last epochs without mosaic")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=320, help="training side (a multiple of 8)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--preview", default=None, help="draw the first batch into this PNG")
    args = parser.parse_args()
    if not hasattr(cachekit.transforms, "Mosaic"):
        raise SystemExit("this cachekit has no cachekit.transforms.Mosaic: the YOLO recipe needs it")
    if (args.cache is None) == (args.synthetic is None):
        raise SystemExit("give a detection cache or --synthetic N")

    workdir = tempfile.TemporaryDirectory() if args.synthetic else None
    path = synthetic_cache(args.synthetic, Path(workdir.name)) if workdir else args.cache
    ds = CachedDataset(path)
    if "boxes" not in ds.fields:
        raise SystemExit(f"{path} has no boxes: build it with --annotations coco.json or yolo")
    classes = max(len(ds.classes), 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with_mosaic, closed = recipes(args.size)
    loader = make_loader(
        ds, args.batch_size, drop_last=True, device=device, normalize=True, augment=with_mosaic
    )
    if args.preview:
        cachekit.preview(loader, n=min(16, len(ds)), out=args.preview)
        print(f"first batch drawn in {args.preview}", flush=True)
    model = GridDetector(classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(f"{len(ds)} images, {classes} classes, loader: {loader.mode}", flush=True)

    losses = []
    for epoch in range(args.epochs):
        if epoch == args.epochs - args.close_mosaic:
            loader.set_augment(closed)  # from this epoch on, as Ultralytics' close_mosaic
        plan = loader.augment_for(loader.sampler.upcoming_epoch())  # what this epoch's batches go through
        epoch_losses = []
        for images, targets in loader:  # a new order, new mosaics and affines every epoch
            loss = detection_loss(model(images), targets, classes)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            epoch_losses.append(loss.item())
        mean = sum(epoch_losses) / max(1, len(epoch_losses))
        losses.append(mean)
        steps = " + ".join(type(s).__name__ for s in plan.listed)  # the whole list (.steps: its geometry)
        print(f"epoch {epoch}: {steps}, {len(epoch_losses)} batches, loss {mean:.4f}", flush=True)
    print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if workdir is not None:
        ds.close()
        workdir.cleanup()


if __name__ == "__main__":
    main()
