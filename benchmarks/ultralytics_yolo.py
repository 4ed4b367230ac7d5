"""Ultralytics' YOLODataset with its default training augmentation, in a 2-worker DataLoader.

    python benchmarks/ultralytics_yolo.py FOLDER [--batch-size 64] [--epochs 1] [--workers 2] [--cache ram]

``FOLDER`` holds ``images/`` and ``labels/`` in YOLO format and a ``data.yaml`` (as
``cachekit.tools.synthetic_objects.make_object_dataset`` writes them). The dataset is built the way
Ultralytics' trainer builds it (``build_yolo_dataset`` in ``mode="train"``, hyperparameters from
``ultralytics.cfg.DEFAULT_CFG``: imgsz 640, mosaic 1.0, translate 0.1, scale 0.5, fliplr 0.5, hsv
0.015/0.7/0.4, ``augment=True``), and read by ``torch.utils.data.DataLoader`` with persistent workers,
shuffling and the dataset's own ``collate_fn``. One warm-up epoch, then ``--epochs`` timed ones.

Run by ``benchmarks/run.py yolo --ultralytics-python PY`` with an interpreter that has ultralytics
(a venv of its own: ``pip install torch torchvision ultralytics``; it runs on CPU). Prints one JSON
line last: samples/s and CPU seconds per wall second of each timed epoch (this process and its
worker processes), and the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _cpu_s(proc) -> float:
    """CPU seconds of ``proc`` and its live children (the DataLoader's workers)."""
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except Exception:  # a worker that just exited
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--cache", choices=["none", "ram"], default="none")
    args = parser.parse_args()
    # Ultralytics keeps its settings in a user folder; keep them out of the user's home and offline.
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="ultralytics-cfg-"))
    os.environ.setdefault("YOLO_OFFLINE", "1")

    import psutil
    import torch
    import ultralytics
    import yaml
    from torch.utils.data import DataLoader
    from ultralytics.cfg import DEFAULT_CFG, get_cfg
    from ultralytics.data.build import build_yolo_dataset

    torch.set_num_threads(1)  # the main process only collates; the work is in the workers
    folder = args.folder.resolve()
    names = yaml.safe_load((folder / "data.yaml").read_text())["names"]
    data = {"names": names, "nc": len(names), "channels": 3, "path": str(folder), "train": "images"}
    cfg = get_cfg(DEFAULT_CFG, {"imgsz": args.imgsz, "cache": False if args.cache == "none" else "ram"})
    dataset = build_yolo_dataset(cfg, str(folder / "images"), args.batch_size, data, mode="train", stride=32)
    loader = DataLoader(
        dataset,
        args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
        collate_fn=dataset.collate_fn,
    )
    for _ in loader:  # warm-up: workers start, the page cache fills
        pass
    proc = psutil.Process()
    rates, cpus = [], []
    for _ in range(args.epochs):
        t0, c0, seen = time.perf_counter(), _cpu_s(proc), 0
        for batch in loader:
            seen += len(batch["img"])
        wall = time.perf_counter() - t0
        rates.append(seen / wall)
        cpus.append((_cpu_s(proc) - c0) / wall)
    first = dataset[0]
    print(
        json.dumps(
            {
                "samples_per_s": rates,
                "cpu_per_wall": cpus,
                "samples": len(dataset),
                "batch_size": args.batch_size,
                "workers": args.workers,
                "cache": args.cache,
                "image_shape": list(first["img"].shape),
                "transforms": [type(t).__name__ for t in dataset.transforms.transforms],
                "mosaic": cfg.mosaic,
                "hyp": {
                    k: getattr(cfg, k)
                    for k in (
                        "degrees",
                        "translate",
                        "scale",
                        "shear",
                        "perspective",
                        "fliplr",
                        "hsv_h",
                        "hsv_s",
                        "hsv_v",
                        "mixup",
                    )
                },  # fmt: skip
                "ultralytics": ultralytics.__version__,
                "torch": torch.__version__,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
