"""Train a tiny object detector from a detection cache: boxes move with every crop and flip.

    cachekit build raw/ --out cache/det --annotations yolo --pipeline letterbox-640    # or coco.json
    python examples/train_detection.py cache/det [--steps 50] [--size 320]
    torchrun --nproc_per_node 2 examples/train_detection.py cache/det                  # the same on 2 ranks

Each batch is letterboxed to --size and flipped half the time on the loader's threads (on the GPU
when there is one); its targets are a list of per-sample dicts, ``{"boxes": float32 [N, 4] xyxy in
the batch's pixels, "classes": int64 [N], ...}``, as torchvision's detection models take them
(``FasterRCNN(...)(images, [{"boxes": t["boxes"], "labels": t["classes"] + 1} for t in targets])``).
The model here is a small CenterNet-style grid detector in plain torch, so the example runs anywhere.
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
from cachekit.transforms import Letterbox, RandomHorizontalFlip

STRIDE = 8


class GridDetector(nn.Module):
    """Per cell of a stride-8 grid: is an object's centre here, which class, and its size."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        chans = [3, 16, 32, 64]
        layers = []
        for a, b in zip(chans, chans[1:]):
            layers += [nn.Conv2d(a, b, 3, stride=2, padding=1), nn.BatchNorm2d(b), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Conv2d(64, 1 + classes + 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def grid_targets(targets: list[dict], classes: int, hw: tuple[int, int], device) -> tuple[torch.Tensor, ...]:
    """Each box as its centre cell: objectness, class and log size per cell."""
    gh, gw = hw[0] // STRIDE, hw[1] // STRIDE
    obj = torch.zeros(len(targets), gh, gw, device=device)
    cls = torch.zeros(len(targets), gh, gw, dtype=torch.long, device=device)
    size = torch.zeros(len(targets), 2, gh, gw, device=device)
    for i, t in enumerate(targets):
        b = t["boxes"]
        if not len(b):
            continue
        cx = ((b[:, 0] + b[:, 2]) / 2 / STRIDE).long().clamp(0, gw - 1)
        cy = ((b[:, 1] + b[:, 3]) / 2 / STRIDE).long().clamp(0, gh - 1)
        obj[i, cy, cx] = 1.0
        cls[i, cy, cx] = t["classes"].clamp(0, classes - 1)
        size[i, :, cy, cx] = torch.log((b[:, 2:] - b[:, :2]).clamp(min=1.0) / STRIDE).T
    return obj, cls, size


def detection_loss(out: torch.Tensor, targets: list[dict], classes: int) -> torch.Tensor:
    obj, cls, size = grid_targets(
        targets, classes, (out.shape[2] * STRIDE, out.shape[3] * STRIDE), out.device
    )
    loss = F.binary_cross_entropy_with_logits(
        out[:, 0], obj, pos_weight=torch.tensor(10.0, device=out.device)
    )
    hit = obj > 0
    if hit.any():
        loss = loss + F.cross_entropy(out[:, 1 : 1 + classes].permute(0, 2, 3, 1)[hit], cls[hit])
        loss = loss + F.l1_loss(out[:, 1 + classes :].permute(0, 2, 3, 1)[hit], size.permute(0, 2, 3, 1)[hit])
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=320, help="letterbox side (a multiple of 8)")
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ  # started by torchrun
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)

    ds = CachedDataset(args.cache)
    if "boxes" not in ds.fields:
        raise SystemExit(f"{args.cache} has no boxes: build it with --annotations coco.json or yolo")
    classes = max(len(ds.classes), 1)
    loader = make_loader(
        ds,
        args.batch_size,
        drop_last=True,
        device=device,
        normalize=True,
        augment=[Letterbox(args.size), RandomHorizontalFlip()],
    )
    model = GridDetector(classes).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if rank == 0:
        print(f"world {world}, {len(ds)} images, {classes} classes, loader: {loader.mode}", flush=True)

    step, losses = 0, []
    reduced = torch.zeros((), device=device)  # all-reduced in place: one tensor, alive to the end
    while step < args.steps:
        for images, targets in loader:  # a new order, new flips every epoch
            loss = detection_loss(model(images), targets, classes)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            reduced.copy_(loss.detach())
            if distributed:
                dist.all_reduce(reduced)
            losses.append(reduced.item() / world)
            if rank == 0 and step % 10 == 0:
                print(f"step {step} loss {losses[-1]:.4f}", flush=True)
            step += 1
            if step >= args.steps:
                break
    if rank == 0:
        k = max(1, min(5, len(losses) // 2))
        print(f"done: loss {sum(losses[:k]) / k:.4f} -> {sum(losses[-k:]) / k:.4f}", flush=True)
    if distributed:
        del model  # DDP holds the group too: destroyed, it stops gloo's threads, which could abort the exit
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
