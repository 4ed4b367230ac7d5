"""Train and evaluate a classifier from two caches: README's training loop, as a script.

    cachekit build raw/train --out cache/train --pipeline train-256
    cachekit build raw/val --out cache/val --pipeline train-256
    python examples/train.py cache/train cache/val [--epochs 3] [--batch-size 64] [--crop 224]
    torchrun --nproc_per_node 2 examples/train.py cache/train cache/val    # the same, on 2 ranks

Training batches are random resized crops, flipped half the time, new every epoch; evaluation
batches are centre crops. The caches may come from either training recipe (``train-256``, each
sample at its own size, or ``classification-224``). On a GPU the crops run there; on CPUs, in
threads. Under torchrun each rank trains on its share and the accuracy is summed over ranks.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 -- imported after init_process_group (by DDP), it holds the group
import torch.nn as nn
import torch.nn.functional as F

from cachekit import CachedDataset, make_loader
from cachekit.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop


def small_cnn(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train")
    parser.add_argument("val")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--crop", type=int, default=224, help="side of the training and evaluation crops")
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ  # started by torchrun
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank = dist.get_rank() if distributed else 0
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)

    train_ds, val_ds = CachedDataset(args.train), CachedDataset(args.val)
    train = make_loader(
        train_ds,
        args.batch_size,
        device=device,
        normalize=True,
        augment=[RandomResizedCrop(args.crop), RandomHorizontalFlip()],
    )
    val = make_loader(
        val_ds, args.batch_size, shuffle=False, device=device, normalize=True, augment=[CenterCrop(args.crop)]
    )
    model = small_cnn(max(len(train_ds.classes), 1)).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    if rank == 0:
        print(
            f"{len(train_ds)} training samples, {len(val_ds)} to evaluate; loader: {train.mode}", flush=True
        )

    for epoch in range(args.epochs):
        model.train()
        for images, labels in train:  # mixed classes, a new order and new crops every epoch
            loss = F.cross_entropy(model(images), labels.clamp(min=0))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        counts = torch.zeros(2, device=device)  # correct, seen
        with torch.no_grad():
            for images, labels in val:
                counts += torch.tensor(
                    [(model(images).argmax(1) == labels).sum(), len(labels)], device=device
                )
        if distributed:
            dist.all_reduce(counts)
        if rank == 0:
            correct, seen = (int(v) for v in counts.tolist())
            print(f"epoch {epoch}: loss {loss.item():.4f}, accuracy {correct}/{seen}", flush=True)
    if distributed:
        del model  # DDP holds the group too: destroyed, it stops gloo's threads, which could abort the exit
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
