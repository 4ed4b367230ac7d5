"""The per-sample pixel stage and MixUp/CutMix through real loaders: the same batches whatever the thread or
worker count, new draws each epoch, the device path equal to the threads, soft labels only with mixing,
and boxes and masks still on their shapes after RandAugment's shears, translations and rotations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_alignment import _check_sample

from cachekit import BuildConfig, CachedDataset, build, collate_batch, make_loader
from cachekit.augment.autoaugment import GEOMETRIC_OPS
from cachekit.augment.plan import compile_plan
from cachekit.feed.assemble import BatchRequest
from cachekit.feed.devicestage import DeviceStage
from cachekit.tools.synthetic import make_synthetic_folder
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import (
    CutMix,
    GaussianBlur,
    MixUp,
    MixUpOrCutMix,
    RandAugment,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomHSV,
    RandomResizedCrop,
    TrivialAugmentWide,
)

DEIT = [
    RandomResizedCrop(32),
    RandomHorizontalFlip(),
    RandAugment(2, 9),
    RandomGrayscale(0.2),
    GaussianBlur(3),
    RandomHSV(),
    RandomErasing(0.5, value="random"),
    MixUpOrCutMix(),
]


@pytest.fixture(scope="module")
def classes_cache(tmp_path_factory):
    raw = make_synthetic_folder(
        tmp_path_factory.mktemp("photo") / "raw", 24, classes=4, size=(56, 72), seed=3
    )
    out = raw.parent / "cache"
    config = BuildConfig(pipeline="classification-224", size=40, shard_size=7, workers=1, progress=False)
    build(raw, out, config)
    return out


@pytest.fixture(scope="module")
def objects_cache(tmp_path_factory):
    raw = make_object_dataset(tmp_path_factory.mktemp("photo_objects") / "raw", 8, size=(120, 160), classes=3)
    out = raw.parent / "cache"
    config = BuildConfig(
        annotations="yolo", masks=str(raw / "masks"), workers=1, progress=False, pipeline="none"
    )
    build(raw, out, config)
    return out


@pytest.fixture(scope="module")
def boxes_cache(objects_cache):
    """The same images with their boxes alone (``collate="yolo"`` refuses a cache with masks)."""
    out = objects_cache.parent / "boxes-cache"
    build(
        objects_cache.parent / "raw",
        out,
        BuildConfig(annotations="yolo", workers=1, progress=False, pipeline="none"),
    )
    return out


def _epoch(loader, epoch: int) -> list:
    loader.set_epoch(epoch)
    return [(images.clone(), labels.clone()) for images, labels, *_ in loader]


def test_same_batches_whatever_threads_or_workers(classes_cache):
    runs = [
        _epoch(make_loader(classes_cache, 8, seed=4, augment=DEIT, **options), 0)
        for options in ({"threads": 1}, {"threads": 2}, {"workers": 2})
    ]
    for other in runs[1:]:
        for (a, la), (b, lb) in zip(runs[0], other):
            assert torch.equal(a, b) and torch.equal(la, lb)
    again = _epoch(make_loader(classes_cache, 8, seed=4, augment=DEIT, threads=2), 1)
    assert not all(torch.equal(a, b) for (a, _), (b, _) in zip(runs[0], again))


def test_device_path_matches_the_threads(classes_cache):
    threads = _epoch(make_loader(classes_cache, 8, seed=9, augment=DEIT), 0)
    device = _epoch(make_loader(classes_cache, 8, seed=9, augment=DEIT, device="cpu", augment_on="device"), 0)
    for (a, la), (b, lb) in zip(threads, device):
        assert torch.equal(la, lb)  # soft labels are decided on the host
        # the two warps agree to a level (the device's is float); HSV's 8-bit hue and Solarize's threshold
        # turn a level into more on a few pixels (the stage itself agrees to a level: tests/augment)
        diff = (a.float() - b.float()).abs()
        assert diff.mean() < 0.5 and (diff > 2).float().mean() < 0.03, (
            diff.mean(),
            (diff > 2).float().mean(),
        )


def test_labels_soft_only_with_mixing(classes_cache):
    images, labels = next(iter(make_loader(classes_cache, 8, seed=1, augment=DEIT[:-1])))
    assert labels.dtype == torch.int64 and labels.shape == (8,)
    for mixing in ([MixUp()], [CutMix()], [MixUp(), CutMix()], [MixUpOrCutMix(p=0.0)]):
        images, soft = next(
            iter(make_loader(classes_cache, 8, seed=1, augment=[RandomResizedCrop(32), *mixing]))
        )
        assert soft.dtype == torch.float32 and soft.shape == (8, 4)
        assert torch.allclose(soft.sum(1), torch.ones(8)) and (soft >= 0).all()
    _, soft = next(
        iter(make_loader(classes_cache, 8, seed=1, augment=[RandomResizedCrop(32), MixUp(num_classes=10)]))
    )
    assert soft.shape == (8, 10)


def _judged_samples(ds, plan, indices, seed, epoch, on_device):
    """A batch read as the loader reads it, on the threads or finished by the device stage."""
    request = BatchRequest(indices, epoch=epoch, seed=seed, plan=plan, threads=2, on_device=on_device)
    batch = collate_batch(ds.read_request(request))
    if on_device:
        batch = DeviceStage("cpu").process(batch)
    return batch[0].numpy(), batch[1]


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("family", ["rand", "wide"])
def test_boxes_and_masks_follow_randaugments_geometric_ops(objects_cache, family, on_device):
    """Every sample whose chain keeps the objects' colours (geometric ops, Identity, Sharpness) is judged
    as test_alignment judges samples, many of them sheared, translated or rotated."""
    ds = CachedDataset(objects_cache)
    step = RandAugment(2, 15) if family == "rand" else TrivialAugmentWide()
    plan = compile_plan([RandomResizedCrop(96, scale=(0.6, 1.0)), step], min_visibility=0.0)
    moved = 0
    for epoch in range(6):
        indices = list(range(len(ds)))
        images, targets = _judged_samples(ds, plan, indices, seed=2, epoch=epoch, on_device=on_device)
        draws = plan.stage.draw(2, epoch, np.array(indices), (96, 96)).parts[0]
        for j, target in enumerate(targets):
            names = [draws.names[o] for o in draws.ops[j] if o >= 0]
            if not set(names) <= {*GEOMETRIC_OPS, "Identity", "Sharpness"}:  # colours changed: not judged
                continue
            steep = [
                m for o, m in zip(draws.ops[j], draws.magnitudes[j]) if draws.names[o].startswith("Shear")
            ]
            if any(abs(m) > 0.5 for m in steep):  # a parallelogram fills too little of its box to judge so
                continue
            geometric = [n for n in names if n in GEOMETRIC_OPS]
            moved += bool(geometric)
            _check_sample(images[j], target, f"{family} {names} epoch {epoch} sample {j}", turned=True)
    assert moved >= 10


@pytest.mark.parametrize("on_device", [False, True])
def test_detection_mixup_keeps_both_samples_boxes(objects_cache, boxes_cache, on_device):
    options = {"device": "cpu", "augment_on": "device"} if on_device else {}
    plain = make_loader(objects_cache, 4, seed=3, shuffle=False, augment=[RandomResizedCrop(64)], **options)
    mixed = make_loader(
        objects_cache, 4, seed=3, shuffle=False, augment=[RandomResizedCrop(64), MixUp()], **options
    )
    for (a, ta), (b, tb) in zip(plain, mixed):
        counts = [len(t["boxes"]) for t in ta]
        assert [len(t["boxes"]) for t in tb] == [counts[j] + counts[j - 1] for j in range(len(counts))]
        for j, t in enumerate(tb):
            assert torch.equal(t["boxes"][: counts[j]], ta[j]["boxes"])
            assert torch.equal(t["classes"][counts[j] :], ta[j - 1]["classes"])
        blend = (a.float() + a.roll(1, 0).float()) / 2
        assert (b.float() - blend).abs().mean() < 16  # r ~ Beta(32, 32): close to an even blend
    rows = next(
        iter(make_loader(boxes_cache, 4, seed=3, augment=[RandomResizedCrop(64), MixUp()], collate="yolo"))
    )[1]
    assert rows.shape[1] == 6 and len(rows) > 0


def test_cutmix_on_a_detection_cache_is_refused(objects_cache):
    for mixing in ([CutMix()], [MixUpOrCutMix()]):
        with pytest.raises(ValueError, match="classification cache"):
            make_loader(objects_cache, 4, augment=[RandomResizedCrop(64), *mixing])


def test_the_deit_example_of_training_md_runs(classes_cache):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "TRAINING.md").read_text(encoding="utf-8")
    section = text[text.index("### RandAugment, erasing") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    for old, new in {
        '"cache/"': repr(str(classes_cache)),
        'device="cuda"': 'device="cpu"',
        "256,": "8,",
    }.items():
        assert old in code
        code = code.replace(old, new)
    seen = []

    def model(images):
        seen.append(images.shape)
        return torch.zeros(images.shape[0], 4, requires_grad=True)

    exec(compile(code, "TRAINING.md", "exec"), {"make_loader": make_loader, "torch": torch, "model": model})
    assert seen and all(tuple(s[1:]) == (3, 224, 224) for s in seen)


def test_mid_epoch_resume_gives_exactly_the_remaining_batches(classes_cache):
    loader = make_loader(classes_cache, 4, seed=8, augment=DEIT)
    batches = iter(loader)  # epoch 0
    first = [next(batches) for _ in range(3)]
    state = loader.state_dict()
    full = make_loader(classes_cache, 4, seed=8, augment=DEIT)
    full.set_epoch(0)
    expected = list(full)
    resumed = make_loader(classes_cache, 4, seed=8, augment=DEIT)
    resumed.load_state_dict(state)
    got = first + list(resumed)
    assert len(got) == len(expected)
    for (a, y), (b, z) in zip(got, expected):
        assert torch.equal(a, b) and torch.equal(y, z)


@pytest.mark.parametrize("on_device", [False, True])
def test_mixed_caches_take_the_stage_and_soft_labels_over_all_their_classes(classes_cache, on_device):
    from cachekit import mix

    mixed = mix([CachedDataset(classes_cache), CachedDataset(classes_cache)])
    options = {"device": "cpu", "augment_on": "device"} if on_device else {}
    images, soft = next(iter(make_loader(mixed, 8, seed=2, augment=DEIT, **options)))
    assert (
        images.shape == (8, 3, 32, 32) and soft.shape == (8, 8) and torch.allclose(soft.sum(1), torch.ones(8))
    )


def test_soft_labels_reach_a_per_sample_transform_loader_as_one_tensor(classes_cache):
    ds = CachedDataset(classes_cache, transform=lambda image: image.float() / 255)
    images, soft = next(iter(make_loader(ds, 8, seed=0, augment=[RandomResizedCrop(32), MixUp()], workers=0)))
    assert (
        images.dtype == torch.float32 and soft.shape == (8, 4) and torch.allclose(soft.sum(1), torch.ones(8))
    )


def test_a_batch_of_soft_labels_read_as_pairs_collates_to_rows():
    from torch.utils.data import default_collate

    from cachekit import SampleBatch

    batch = SampleBatch(
        torch.zeros(3, 3, 4, 4, dtype=torch.uint8), torch.tensor([[0.2, 0.8], [1.0, 0.0], [0.5, 0.5]])
    )
    images, labels = default_collate(list(batch))
    assert images.shape == (3, 3, 4, 4) and torch.equal(labels, batch.labels)


def test_num_classes_fewer_than_the_caches_is_refused_when_made(classes_cache):
    # 4 classes, soft labels of 3: refused by make_loader, not at the first batch holding label 3
    for steps in ([MixUp(num_classes=3)], [CutMix(num_classes=2)], [MixUpOrCutMix(num_classes=1)]):
        with pytest.raises(ValueError, match="fewer than this cache's 4 classes") as info:
            make_loader(classes_cache, 8, seed=1, augment=steps)
        assert "\n" not in str(info.value)
    _, labels = next(iter(make_loader(classes_cache, 8, seed=1, augment=[MixUp(num_classes=10)])))
    assert labels.shape == (8, 10)  # more than the cache's: the model's head


_FORK_WHILE_CV2_RUNS = """
import sys, threading
import cv2, numpy as np
from cachekit import make_loader
from cachekit.transforms import RandAugment, RandomResizedCrop

def busy(stop):
    plane = np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)
    while not stop.is_set():
        cv2.calcHist([plane], [0], None, [256], [0, 256])

def reading(stop):  # cachekit's own threads over a batch, in this process, while workers fork
    loader = make_loader(sys.argv[1], 8, augment=[RandomResizedCrop(32), RandAugment(2, 9)], threads=2)
    while not stop.is_set():
        for _ in loader:
            pass

stop = threading.Event()
threads = [threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(3)]
threads.append(threading.Thread(target=reading, args=(stop,), daemon=True))
for t in threads:
    t.start()
for run in range(int(sys.argv[2])):
    loader = make_loader(sys.argv[1], 8, seed=run, augment=[RandomResizedCrop(32), RandAugment(2, 9)], workers=2)
    print(run, sum(len(x) for x, *_ in loader), flush=True)
    del loader
stop.set()
for t in threads:
    t.join()
"""


@pytest.mark.slow  # ten loaders started under load: half a minute
def test_workers_never_hang_on_a_lock_threads_of_the_parent_held(classes_cache, tmp_path):
    # threads of this process run cv2.calcHist (on OpenCV's own pool), import np.random, and read a
    # loader on cachekit's threads while each loader forks its workers, whose RandAugment equalizes
    # with calcHist: a worker forked while one of those held a lock (OpenCV's, or the module lock of
    # an import under way) waited for ever on it; feed.forking makes the fork wait them out. No main
    # guard: workers fork, as torch's do on Linux
    import subprocess
    import sys

    script = tmp_path / "fork_while_cv2_runs.py"
    script.write_text(_FORK_WHILE_CV2_RUNS)
    runs = 10
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(classes_cache), str(runs)],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a loader's workers hung (runs finished: {exc.stdout!r})")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [w for run in range(runs) for w in (str(run), "24")]
