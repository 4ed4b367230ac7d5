"""Read-path suites for detection and for antialiased classification crops.

detect   letterbox + flip with boxes: what Ultralytics-style users run (per sample: OpenCV decode of
         the JPEG, its YOLO label file, letterbox, flip, box math, in a 2-worker DataLoader) against
         the same per-sample transform over the cache in 2 workers, and make_loader(augment=
         [Letterbox, RandomHorizontalFlip]) reading the cache in this process; also the cost of
         boxes (~7 an image): make_loader on the detection cache against the same images without
ceiling  RandomResizedCrop(224) + flip, antialiased, from a train-256 cache: make_loader against a
         bare memory map of the same pixels and a thread pool doing the same crop, two ways: torch's
         antialiased resize on planes, and OpenCV on channels-last pixels (INTER_AREA to shrink,
         INTER_LINEAR to grow, NHWC out), one thread each: the fastest this machine does that work
"""

from __future__ import annotations

import statistics
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from feed_suites import _interleaved, _train256
from registry import suite
from torch.utils.data import DataLoader, Dataset

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.plan import compile_plan
from cachekit.augment.warp import single_threaded_torch
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import Letterbox, RandomHorizontalFlip, RandomResizedCrop

warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable"
)  # read-only maps, only read


def _letterbox_boxes(
    img: np.ndarray, boxes: np.ndarray, size: int, flip: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Ultralytics' LetterBox (resize with cv2, pad with 114) and a flip, on an image and its xyxy boxes."""
    h, w = img.shape[:2]
    r = size / max(h, w)
    nh, nw = round(h * r), round(w * r)
    if (nh, nw) != (h, w):
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    top, left = (size - nh) // 2, (size - nw) // 2
    img = cv2.copyMakeBorder(
        img, top, size - nh - top, left, size - nw - left, cv2.BORDER_CONSTANT, value=(114,) * 3
    )
    boxes = boxes * [nw / w, nh / h, nw / w, nh / h] + [left, top, left, top]
    if flip:
        img = np.ascontiguousarray(img[:, ::-1])
        boxes = np.stack([size - boxes[:, 2], boxes[:, 1], size - boxes[:, 0], boxes[:, 3]], axis=1)
    return img, boxes


class YoloFolder(Dataset):
    """Raw JPEGs and their YOLO label files, decoded and letterboxed per sample (the usual loader)."""

    def __init__(self, raw: Path, size: int) -> None:
        self.images = sorted((raw / "images").glob("*.jpg"))
        self.raw, self.size = raw, size

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = cv2.cvtColor(cv2.imread(str(self.images[i])), cv2.COLOR_BGR2RGB)
        text = (self.raw / "labels" / f"{self.images[i].stem}.txt").read_text()
        rows = np.array(
            [line.split() for line in text.splitlines() if line.strip()], dtype=np.float64
        ).reshape(-1, 5)
        h, w = img.shape[:2]
        cx, cy, bw, bh = rows[:, 1] * w, rows[:, 2] * h, rows[:, 3] * w, rows[:, 4] * h
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
        img, boxes = _letterbox_boxes(img, boxes, self.size, bool(np.random.rand() < 0.5))
        target = {
            "boxes": torch.from_numpy(boxes.astype(np.float32)),
            "classes": torch.from_numpy(rows[:, 0].astype(np.int64)),
        }
        return torch.from_numpy(img).permute(2, 0, 1), target


class CachePerSample(Dataset):
    """The cache read sample by sample, with the same per-sample letterbox, flip and box math."""

    def __init__(self, cache: Path, size: int) -> None:
        self.ds, self.size = CachedDataset(cache), size

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        image, t = self.ds[i]
        img = np.ascontiguousarray(image.numpy().transpose(1, 2, 0))
        img, boxes = _letterbox_boxes(img, t["boxes"].numpy(), self.size, bool(np.random.rand() < 0.5))
        return torch.from_numpy(img).permute(2, 0, 1), {"boxes": torch.from_numpy(boxes.astype(np.float32)),
                                                         "classes": t["classes"]}  # fmt: skip


def _collate(batch):
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


def _objects(args, root: Path) -> Path:
    raw = root / f"objects-{args.images}"
    if not raw.is_dir():
        make_object_dataset(raw, args.images, size=(375, 500), most=14, ext=".jpg")  # ~7 objects an image
    return raw


@suite
def detect(args, root):
    size = 640
    raw = _objects(args, root)
    cache = root / f"detect-{raw.name}"
    if not cache.is_dir():  # stored with the longer side at 640, as Ultralytics' image cache keeps them
        build(raw, cache, BuildConfig(annotations="yolo", pipeline="max-side-512", size=size, progress=False))
    plain = root / f"plain-{raw.name}"
    if not plain.is_dir():  # the same images without boxes: what boxes cost
        rows = "".join(f"{p.relative_to(raw).as_posix()},0\n" for p in sorted((raw / "images").glob("*.jpg")))
        (root / f"{raw.name}.csv").write_text(rows)
        build(raw, plain, BuildConfig(labels=str(root / f"{raw.name}.csv"), pipeline="max-side-512", size=size,
                                      progress=False))  # fmt: skip
    bs = args.batch_size
    workers = {"num_workers": 2, "persistent_workers": True, "collate_fn": _collate}
    steps = [Letterbox(size), RandomHorizontalFlip()]
    rows = _interleaved(
        {
            "raw JPEG + YOLO txt, per-sample OpenCV letterbox + flip + box math, 2 workers": DataLoader(
                YoloFolder(raw, size), bs, shuffle=True, **workers
            ),
            "cache, the same per-sample transform, 2 workers": DataLoader(
                CachePerSample(cache, size), bs, shuffle=True, **workers
            ),
            "make_loader(augment=[Letterbox(640), RandomHorizontalFlip()]), boxes moved": make_loader(
                cache, bs, augment=steps
            ),
            "the same images without boxes": make_loader(plain, bs, augment=steps),
        },
        args.repeats,
    )
    raw_row, per_sample, ours, no_boxes = rows
    boxes = sum(len(CachedDataset(cache)[i][1]["boxes"]) for i in range(min(200, args.images)))
    out = {
        "rows": rows,
        "vs_raw": ours["ratio_to_first"],
        "vs_per_sample_cache": ours["samples_per_s"] / per_sample["samples_per_s"],
        "boxes_cost": 1 - ours["samples_per_s"] / no_boxes["samples_per_s"],
        "boxes_per_image": boxes / min(200, args.images),
    }
    print(f"make_loader / raw per-sample loader: {out['vs_raw']:.2f}x (median of per-round ratios)")
    print(f"make_loader / the same transform per sample over the cache: {out['vs_per_sample_cache']:.2f}x")
    print(f"boxes ({out['boxes_per_image']:.1f} an image) cost {100 * out['boxes_cost']:.1f}% of read speed")
    return out


class _Ceiling:
    """A bare memory map of a train-256 cache's pixels and a pool of threads cropping from it.

    ``layout="planes"``: the pixels as the cache keeps them ([C, H, W]), torch's antialiased
    resize; ``layout="hwc"``: the pixels channels-last, OpenCV's resize (INTER_AREA shrinking,
    INTER_LINEAR enlarging) into an NHWC batch, as a hand-written OpenCV loader does it.
    """

    def __init__(self, cache: Path, threads: int, layout: str = "planes") -> None:
        ds = CachedDataset(cache)
        rows = [ds[i][0].numpy() for i in range(len(ds))]
        if layout == "hwc":
            rows = [np.ascontiguousarray(r.transpose(1, 2, 0)) for r in rows]
        sizes = np.array([r.shape for r in rows])
        self.offsets = np.concatenate([[0], np.cumsum([r.size for r in rows])])
        name = f"{cache}.{layout}.flat.npy"
        flat = np.lib.format.open_memmap(name, "w+", np.uint8, (int(self.offsets[-1]),))
        for r, o in zip(rows, self.offsets):
            flat[o : o + r.size] = r.reshape(-1)
        flat.flush()
        self.flat = np.load(name, mmap_mode="r")
        self.sizes, self.n, self.layout = sizes, len(rows), layout
        init = single_threaded_torch if layout == "planes" else (lambda: cv2.setNumThreads(1))
        self.pool = ThreadPoolExecutor(threads, initializer=init)
        self.threads = threads
        self.plan = compile_plan([RandomResizedCrop(224), RandomHorizontalFlip()])

    def _image(self, i: int) -> np.ndarray:
        shape = self.sizes[i]
        return self.flat[self.offsets[i] : self.offsets[i] + int(np.prod(shape))].reshape(shape)

    def epoch(self, batch: int, rng: np.random.Generator) -> int:
        """One pass in a random order; every sample's crop box and flip drawn as make_loader draws them."""
        order = rng.permutation(self.n)
        hwc = self.layout == "hwc"
        for lo in range(0, self.n, batch):
            idx = order[lo : lo + batch]
            if hwc:
                h, w = self.sizes[idx, 0], self.sizes[idx, 1]
                out = np.empty((len(idx), 224, 224, 3), np.uint8)
            else:
                h, w = self.sizes[idx, 1], self.sizes[idx, 2]
                out = np.empty((len(idx), 3, 224, 224), np.uint8)
            draws = self.plan.draw(0, 0, idx, h, w)

            def work(part, idx=idx, draws=draws, out=out):
                for j in part:
                    img = self._image(idx[j])
                    t, left, ch, cw = draws.boxes[j]
                    if hwc:
                        shrink = ch > 224 or cw > 224
                        cv2.resize(img[t : t + ch, left : left + cw], (224, 224), dst=out[j],
                                   interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)  # fmt: skip
                        if draws.flips[j]:
                            cv2.flip(out[j], 1, dst=out[j])
                        continue
                    crop = torch.from_numpy(np.asarray(img[:, t : t + ch, left : left + cw]))[None]
                    res = F.interpolate(crop, size=(224, 224), mode="bilinear", antialias=True)[0].numpy()
                    out[j] = res[:, :, ::-1] if draws.flips[j] else res

            list(self.pool.map(work, np.array_split(np.arange(len(idx)), self.threads)))
        return self.n


@suite
def ceiling(args, root):
    cache = _train256(args, root)
    bare = {"planes": _Ceiling(cache, threads=2), "hwc": _Ceiling(cache, threads=2, layout="hwc")}
    steps = [RandomResizedCrop(224), RandomHorizontalFlip()]
    hwc_cache = _train256(args, root, "pixels-hwc")
    loaders = {  # the cache of planes (the default); the same pixels stored channels-last, batches NHWC
        "planes": make_loader(cache, args.batch_size, augment=steps, threads=2),
        "pixels-hwc": make_loader(hwc_cache, args.batch_size, augment=steps, threads=2, channels_last=True),
    }
    rng = np.random.default_rng(0)
    for b in bare.values():
        b.epoch(args.batch_size, rng)
    for loader in loaders.values():
        for _ in loader:
            pass
    mine = {k: [] for k in loaders}
    cpu_mine = {k: [] for k in loaders}
    theirs = {k: [] for k in bare}
    cpu_theirs = {k: [] for k in bare}  # CPU seconds per sample, every thread of this process
    for _ in range(args.repeats):  # in turn, so that a slow spell of the machine hits every row
        for name, b in bare.items():
            t0, c0 = time.perf_counter(), time.process_time()
            n = b.epoch(args.batch_size, rng)
            theirs[name].append(n / (time.perf_counter() - t0))
            cpu_theirs[name].append((time.process_time() - c0) / n)
        for name, loader in loaders.items():
            t0, c0, m = time.perf_counter(), time.process_time(), 0
            for _, labels in loader:
                m += len(labels)
            mine[name].append(m / (time.perf_counter() - t0))
            cpu_mine[name].append((time.process_time() - c0) / m)
    ours, cpu_ours = mine["planes"], cpu_mine["planes"]
    hwc, cpu_hwc = mine["pixels-hwc"], cpu_mine["pixels-hwc"]
    cpu = {k: statistics.median(b / a for a, b in zip(cpu_ours, runs)) for k, runs in cpu_theirs.items()}
    ratios = {k: statistics.median(a / b for a, b in zip(ours, runs)) for k, runs in theirs.items()}
    hwc_ratio = statistics.median(a / b for a, b in zip(hwc, theirs["hwc"]))
    hwc_cpu = statistics.median(b / a for a, b in zip(cpu_hwc, cpu_theirs["hwc"]))
    print(f"make_loader RandomResizedCrop(224) + flip, antialiased: {statistics.median(ours):,.0f} samples/s")
    print(
        f"the same, cache built with --store pixels-hwc, channels_last=True: {statistics.median(hwc):,.0f} samples/s"
    )
    print(
        f"bare memory map of planes + 2 threads, torch's resize: {statistics.median(theirs['planes']):,.0f} samples/s"
    )
    print(f"bare memory map of HWC pixels + 2 threads, OpenCV INTER_AREA/LINEAR, NHWC out: "
          f"{statistics.median(theirs['hwc']):,.0f} samples/s")  # fmt: skip
    print(f"make_loader / torch ceiling: {ratios['planes']:.2f}x (median of per-round ratios)")
    print(f"make_loader / OpenCV ceiling: {ratios['hwc']:.2f}x (median of per-round ratios)")
    print(f"make_loader over --store pixels-hwc, channels_last=True / OpenCV ceiling: {hwc_ratio:.2f}x per wall-second "
          f"(rounds: {', '.join(f'{a / b:.2f}' for a, b in zip(hwc, theirs['hwc']))}), {hwc_cpu:.2f}x "
          f"per CPU-second ({1e6 * statistics.median(cpu_hwc):.0f} us a sample)")  # fmt: skip
    print(f"CPU per sample: make_loader {1e6 * statistics.median(cpu_ours):.0f} us, torch ceiling "
          f"{1e6 * statistics.median(cpu_theirs['planes']):.0f} us, OpenCV ceiling "
          f"{1e6 * statistics.median(cpu_theirs['hwc']):.0f} us: samples per CPU-second "
          f"{cpu['planes']:.2f}x and {cpu['hwc']:.2f}x theirs")  # fmt: skip
    return {
        "ours": statistics.median(ours),
        "ceiling": statistics.median(theirs["planes"]),
        "ceiling_opencv": statistics.median(theirs["hwc"]),
        "ratio": ratios["planes"],
        "ratio_opencv": ratios["hwc"],
        "cpu_ratio": cpu["planes"],
        "cpu_ratio_opencv": cpu["hwc"],
        "ours_hwc": statistics.median(hwc),
        "ratio_opencv_hwc": hwc_ratio,
        "cpu_ratio_opencv_hwc": hwc_cpu,
        "rounds": {"ours": ours, "ours_hwc": hwc, **theirs},
    }
