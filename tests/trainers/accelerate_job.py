"""An Accelerate run over ``prepare_loader``, recording what each process saw (run by test_accelerate.py).

    torchrun --nproc_per_node 2 accelerate_job.py CACHE OUT [--epochs N] [--save-at E:S] [--resume DIR]

Each process appends one JSON line per training batch to ``OUT/rank<r>.jsonl``: the epoch, the
batch's index, the labels (each sample of the test cache has its own class, so a label names its
sample) and a digest of each augmented image. ``--save-at E:S`` saves the state after batch S of
epoch E and goes on; ``--resume DIR`` loads it and continues from there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from cachekit.trainers.accelerate import prepare_loader
from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop


def digest(image: torch.Tensor) -> str:
    return hashlib.blake2b(image.contiguous().numpy().tobytes(), digest_size=8).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-at", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--mixed-precision", default="no")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, mixed_precision=args.mixed_precision)
    set_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4))
    inside: dict[str, str] = {}  # the dtype the layer computes in: bf16 under mixed precision
    model[0].register_forward_hook(lambda module, args, output: inside.update(dtype=str(output.dtype)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)  # the loader is left out of prepare
    loader = prepare_loader(
        accelerator, args.cache, 4, augment=[RandomResizedCrop(24), RandomHorizontalFlip()]
    )
    first = 0
    if args.resume:
        accelerator.load_state(args.resume)
        first = loader.sampler.epoch
    save_at = tuple(int(v) for v in args.save_at.split(":")) if args.save_at else None
    rank = accelerator.process_index
    for epoch in range(first, args.epochs):
        loader.set_epoch(epoch)  # a resumed epoch keeps its position: its first batch is the next one
        start = -(-loader.sampler.num_samples // 4) - len(loader)  # batches of the epoch already run
        for step, (images, labels) in enumerate(loader, start):
            loss = model(images.float().mean((2, 3))).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            row = {"epoch": epoch, "step": step, "labels": labels.tolist(), "images": [digest(x) for x in images],
                   "dtype": str(images.dtype), "inside": inside["dtype"]}  # fmt: skip
            with open(os.path.join(args.out, f"rank{rank}.jsonl"), "a") as fh:
                fh.write(json.dumps(row) + "\n")
            if save_at == (epoch, step):
                accelerator.save_state(os.path.join(args.out, "state"))
    accelerator.end_training()


if __name__ == "__main__":
    main()
