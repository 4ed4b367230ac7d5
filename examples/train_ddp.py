"""Train a tiny CNN for a few steps on a cache with DistributedDataParallel.

    torchrun --nproc_per_node 2 examples/train_ddp.py CACHE [--steps 30] [--batch-size 32] [--crop 224]
    python examples/train_ddp.py CACHE          # the same in one process

CACHE may come from either training recipe: ``--pipeline train-256`` (each sample at its own size,
shorter side 256) or ``classification-224``; every batch is a random 224x224 crop, flipped half the
time, drawn anew every epoch. Runs on CPUs (gloo) and unchanged on GPUs (nccl, one per rank).
Prints the loss every few steps.
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
from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop


def tiny_cnn(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--crop", type=int, default=224, help="side of the random crops")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    distributed = "WORLD_SIZE" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)

    ds = CachedDataset(args.cache)
    classes = max(len(ds.classes), 1)
    loader = make_loader(
        ds,
        args.batch_size,
        drop_last=True,
        device=device,
        normalize=True,
        augment=[RandomResizedCrop(args.crop), RandomHorizontalFlip()],
    )
    model = tiny_cnn(classes).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if rank == 0:
        print(f"world {world}, {len(ds)} samples, loader: {loader.mode}", flush=True)

    step, losses = 0, []
    while step < args.steps:
        for images, labels in loader:  # each pass is a new epoch: a new order and new crops on every rank
            loss = F.cross_entropy(model(images), labels.clamp(min=0))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            value = loss.detach().clone()
            if distributed:
                dist.all_reduce(value)
            value = value.item() / world
            losses.append(value)
            if rank == 0 and step % 5 == 0:
                print(f"step {step} loss {value:.4f}", flush=True)
            step += 1
            if step >= args.steps:
                break
    if rank == 0:
        k = max(1, min(5, len(losses) // 2))  # mean of the first and last few steps
        first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
        print(f"done: loss {first:.4f} -> {last:.4f}", flush=True)
    if distributed:
        del model  # DDP holds the group too: destroyed, it stops gloo's threads, which could abort the exit
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
