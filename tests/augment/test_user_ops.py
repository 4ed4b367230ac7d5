"""The user's own ops (``PixelOp``, ``BatchOp``, ``MatrixOp``) on the fast path, threads and device.

One op of each kind is defined here, in this file alone, and run through real loaders over a real
cache of flat-coloured rectangles with boxes and masks: each does what it says to the pixels, moves
what its kind moves (a matrix moves pixels, boxes and masks together; a pixel or batch op moves no
target), draws its randomness from (seed, epoch, sample or batch) so that two loaders agree and a
resumed epoch repeats it, and fails in one line naming the op and the sample.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.errors import UsageError
from cachekit.feed.prefetch import ReadTimeout
from cachekit.tools.synthetic_objects import OBJECT_COLOURS, make_object_dataset
from cachekit.transforms import BatchOp, MatrixOp, MixUp, PixelOp, RandomHorizontalFlip, Resize

H, W = 60, 80
SEED = 7
THREADS = {"augment_on": "threads", "threads": 2}
DEVICE = {"device": "cpu", "augment_on": "device"}


# -- the user's ops, as a user would write them ---------------------------------------------------


def mark(image, rng):
    """Paint the red channel of the top-left 4 rows x 8 columns one value drawn from ``rng``."""
    out = image.copy()
    out[:4, :8, 0] = rng.integers(1, 255)
    return out


def halve_some(images, generator):
    """Halve the pixel values of a random half of the batch's samples."""
    chosen = torch.rand(len(images), generator=generator, device=images.device) < 0.5
    out = images.clone()
    out[chosen] = images[chosen] // 2
    return out


def identity(height, width, rng):
    return np.eye(3)


def transpose(height, width, rng):
    """Rows become columns: (x, y) -> (y, x)."""
    return np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])


def shear(height, width, rng):
    """A horizontal shear about the image's middle row, its amount drawn from ``rng``."""
    a = rng.uniform(-0.4, 0.4)
    return np.array([[1.0, a, -a * height / 2], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


# -- a cache with boxes and masks ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("userops")
    raw = make_object_dataset(tmp / "raw", 10, size=(H, W), classes=3, seed=5)
    config = BuildConfig(
        annotations="yolo", masks=str(raw / "masks"), workers=1, progress=False, min_visibility=0.0, pipeline="none"
    )
    build(raw, tmp / "cache", config)
    return CachedDataset(tmp / "cache")


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    """The same objects stored at one size, 64 x 64 (what an op does to pixels is seen exactly)."""
    tmp = tmp_path_factory.mktemp("userops-square")
    raw = make_object_dataset(tmp / "raw", 8, size=(H, W), classes=3, seed=5)
    config = BuildConfig(
        annotations="yolo",
        masks=str(raw / "masks"),
        workers=1,
        progress=False,
        min_visibility=0.0,
        pipeline="classification-224",
        size=64,
    )
    build(raw, tmp / "cache", config)
    return CachedDataset(tmp / "cache")


def _read(ds, augment, batch_size=4, epochs=1, **options):
    """Every batch of ``epochs`` epochs: (images uint8 [B, C, H, W], targets) each."""
    loader = make_loader(ds, batch_size, seed=SEED, augment=augment, shuffle=False, **options)
    out = []
    for _ in range(epochs):
        for images, targets in loader:
            out.append((images.clone(), [{k: v.clone() for k, v in t.items()} for t in targets]))
    return out


def _same_targets(a, b) -> None:
    for ta, tb in zip(a, b, strict=True):
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), key


BASE = [Resize((H, W))]


# -- PixelOp ------------------------------------------------------------------------------------------


def test_a_pixel_op_runs_on_each_sample_as_hwc_and_moves_no_target(cache):
    plain = _read(cache, BASE, **THREADS)
    marked = _read(cache, [*BASE, PixelOp(mark)], **THREADS)
    values = []
    for (x0, t0), (x1, t1) in zip(plain, marked, strict=True):
        _same_targets(t0, t1)
        block = x1[:, 0, :4, :8]
        assert (block == block[:, :1, :1]).all()  # one value per sample, on rows 0-3, columns 0-7
        values += block[:, 0, 0].tolist()
        x1 = x1.clone()
        x1[:, 0, :4, :8] = x0[:, 0, :4, :8]
        assert torch.equal(x0, x1)  # nothing else changed: other channels, rows, columns
    assert len(set(values)) > 3  # drawn per sample


def test_a_pixel_op_draws_from_seed_epoch_and_index_whatever_the_batches(cache):
    one = _read(cache, [*BASE, PixelOp(mark)], batch_size=4, epochs=2, **THREADS)
    other = _read(cache, [*BASE, PixelOp(mark)], batch_size=3, epochs=2, threads=1, augment_on="threads")
    flat = lambda batches: torch.cat([x[:, 0, 0, 0] for x, _ in batches])  # noqa: E731
    a, b = flat(one), flat(other)
    assert torch.equal(a, b)
    assert not torch.equal(a[:10], a[10:])  # a new draw each epoch


def test_a_pixel_op_on_the_device_path_is_refused_naming_batch_op(cache):
    with pytest.raises(UsageError, match=r"PixelOp\(test_user_ops.mark\).*BatchOp"):
        make_loader(cache, 4, seed=SEED, augment=[*BASE, PixelOp(mark)], **DEVICE)


# -- BatchOp ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [THREADS, DEVICE], ids=["threads", "device"])
def test_a_batch_op_runs_on_the_uint8_batch_and_moves_no_target(cache, path):
    plain = _read(cache, BASE, epochs=2, **path)
    halved = _read(cache, [*BASE, BatchOp(halve_some)], epochs=2, **path)
    chosen = []
    for (x0, t0), (x1, t1) in zip(plain, halved, strict=True):
        _same_targets(t0, t1)
        assert x1.dtype == torch.uint8
        for a, b in zip(x0, x1, strict=True):
            assert torch.equal(b, a) or torch.equal(b, a // 2)
            chosen.append(not torch.equal(b, a))
    assert 0 < sum(chosen) < len(chosen)
    again = _read(cache, [*BASE, BatchOp(halve_some)], epochs=2, **path)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(halved, again, strict=True))  # two loaders agree


def test_a_batch_op_chooses_the_same_samples_on_threads_and_device(cache):
    def chosen(path):
        plain = _read(cache, BASE, **path)
        halved = _read(cache, [*BASE, BatchOp(halve_some)], **path)
        return [not torch.equal(a, b) for (x0, _), (x1, _) in zip(plain, halved) for a, b in zip(x0, x1)]

    assert chosen(THREADS) == chosen(DEVICE)


@pytest.mark.parametrize("path", [THREADS, DEVICE], ids=["threads", "device"])
def test_a_batch_op_listed_after_mixup_sees_the_mixed_batch(cache, path):
    seen = {}

    def record(images, generator):
        seen.setdefault("first", images.clone())
        return images

    mixed = _read(cache, [*BASE, MixUp(p=1.0), BatchOp(record)], batch_size=10, **path)
    assert torch.equal(seen["first"], mixed[0][0])
    seen.clear()
    _read(cache, [*BASE, BatchOp(record), MixUp(p=1.0)], batch_size=10, **path)
    plain = _read(cache, BASE, batch_size=10, **path)
    assert torch.equal(seen["first"], plain[0][0])  # listed before: the batch before mixing
    assert not torch.equal(plain[0][0], mixed[0][0])


def test_two_pixel_ops_draw_from_streams_of_their_own(cache):
    twice = _read(cache, [*BASE, PixelOp(mark), PixelOp(mark)], **THREADS)
    once = _read(cache, [*BASE, PixelOp(mark)], **THREADS)
    a = torch.cat([x[:, 0, 0, 0] for x, _ in twice])
    b = torch.cat([x[:, 0, 0, 0] for x, _ in once])
    assert not torch.equal(a, b)  # the second op's draws are not the first's


# -- MatrixOp -----------------------------------------------------------------------------------------


def shift(height, width, rng):
    """Eight columns left, four rows up."""
    return np.array([[1.0, 0.0, -8.0], [0.0, 1.0, -4.0], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("path", [THREADS, DEVICE], ids=["threads", "device"])
def test_a_matrix_op_moves_pixels_boxes_and_masks_together(square, path):
    plain = _read(square, None, **path)
    turned = _read(square, [MatrixOp(transpose)], **path)
    cut = _read(square, [MatrixOp(shift, size=(40, 48))], **path)
    after = _read(square, [RandomHorizontalFlip(p=1.0), MatrixOp(shift, size=(40, 48))], **path)
    for (x0, t0), (x1, t1), (x2, t2), (x3, _) in zip(plain, turned, cut, after, strict=True):
        assert torch.equal(x1, x0.transpose(-1, -2))  # continuous coordinates: pixel (i, j) to (j, i)
        assert x2.shape[-2:] == (40, 48) and torch.equal(x2, x0[:, :, 4:44, 8:56])  # its size, not the input's
        assert torch.equal(x3, x0.flip(-1)[:, :, 4:44, 8:56])  # after the steps listed before it
        for a, b, c in zip(t0, t1, t2, strict=True):
            assert torch.equal(b["mask"], a["mask"].T)
            assert torch.equal(b["boxes"], a["boxes"][:, [1, 0, 3, 2]])
            assert torch.equal(b["classes"], a["classes"])
            assert torch.equal(c["mask"], a["mask"][4:44, 8:56])
            moved = (a["boxes"] - torch.tensor([8.0, 4.0, 8.0, 4.0])).clamp(min=0)
            moved = torch.minimum(moved, torch.tensor([48.0, 40.0, 48.0, 40.0]))
            kept = (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
            assert torch.equal(c["boxes"], moved[kept]) and torch.equal(c["classes"], a["classes"][kept])


def _colour_regions(image_chw: np.ndarray, colour) -> list[tuple[int, int, int, int]]:
    """xyxy boxes round the pixels of one object colour (4-connected), as whole pixels."""
    hit = (np.abs(image_chw.astype(np.int64) - np.array(colour)[:, None, None]).max(axis=0) < 40).astype(np.uint8)
    _, _, stats, _ = cv2.connectedComponentsWithStats(hit, connectivity=4)
    return [(x, y, x + w, y + h) for x, y, w, h, area in stats[1:] if area >= 6]


@pytest.mark.parametrize("path", [THREADS, DEVICE], ids=["threads", "device"])
def test_a_filled_rectangle_stays_inside_its_box_after_a_drawn_shear(cache, path):
    batches = _read(cache, [*BASE, MatrixOp(shear), RandomHorizontalFlip()], epochs=2, **path)
    checked = 0
    for images, targets in batches:
        for image, target in zip(images.numpy(), targets, strict=True):
            boxes, classes = target["boxes"].numpy(), target["classes"].numpy()
            mask = target["mask"].numpy()
            for c in range(3):
                mine = boxes[classes == c]
                for x0, y0, x1, y1 in _colour_regions(image, OBJECT_COLOURS[c]):
                    inside = [
                        b for b in mine if b[0] - 1.5 <= x0 and b[1] - 1.5 <= y0 and x1 <= b[2] + 1.5 and y1 <= b[3] + 1.5
                    ]
                    assert inside, (c, (x0, y0, x1, y1), mine)
                    core = mask[y0 + (y1 - y0) // 2, x0 : x1]
                    assert (core == c + 1).mean() > 0.5  # the mask moved with the pixels
                    checked += 1
    assert checked > 20


def test_matrix_op_draws_are_the_same_in_two_loaders_and_new_each_epoch(cache):
    a = _read(cache, [*BASE, MatrixOp(shear)], epochs=2, **THREADS)
    b = _read(cache, [*BASE, MatrixOp(shear)], epochs=2, batch_size=5, **THREADS)
    xa, xb = torch.cat([x for x, _ in a]), torch.cat([x for x, _ in b])
    assert torch.equal(xa, xb)
    assert not torch.equal(xa[:10], xa[10:])


# -- resume -------------------------------------------------------------------------------------------

ALL = [Resize((H, W)), MatrixOp(shear), PixelOp(mark), BatchOp(halve_some)]


def test_a_resumed_epoch_with_user_ops_equals_the_uninterrupted_one(cache):
    full = _read(cache, ALL, batch_size=3, epochs=2, **THREADS)
    loader = make_loader(cache, 3, seed=SEED, augment=ALL, shuffle=False, **THREADS)
    for _ in loader:  # epoch 0
        pass
    it = iter(loader)
    head = [next(it)[0].clone() for _ in range(2)]
    state = loader.state_dict()
    del it
    assert "PixelOp('test_user_ops.mark')" in state["augment"]
    resumed = make_loader(cache, 3, seed=SEED, augment=list(ALL), shuffle=False, **THREADS)
    resumed.load_state_dict(state)
    rest = [x.clone() for x, _ in resumed]
    got = head + rest
    want = [x for x, _ in full[len(full) // 2 :]]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_resumed_loader_without_the_same_ops_is_refused_in_one_line(cache):
    loader = make_loader(cache, 3, seed=SEED, augment=ALL, shuffle=False, **THREADS)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = make_loader(cache, 3, seed=SEED, augment=BASE, shuffle=False, **THREADS)
    with pytest.raises(UsageError, match=r"MatrixOp\('test_user_ops.shear'\).*same augment list"):
        other.load_state_dict(state)
    plain = make_loader(cache, 3, seed=SEED, augment=BASE, shuffle=False, **THREADS)
    it = iter(plain)
    next(it)
    saved = plain.state_dict()
    del it
    added = make_loader(cache, 3, seed=SEED, augment=ALL, shuffle=False, **THREADS)
    with pytest.raises(UsageError, match="same augment list"):
        added.load_state_dict(saved)


# -- mistakes: one line naming the op and the sample --------------------------------------------------


def boom(image, rng):
    raise RuntimeError("my op broke")


def smaller(image, rng):
    return image[1:]


def as_floats(image, rng):
    return image.astype(np.float64)


def floats(images, generator):
    return images.float()


def nan_matrix(height, width, rng):
    return np.full((3, 3), np.nan)


def flat_matrix(height, width, rng):
    return np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])


def two_by_three(height, width, rng):
    return np.eye(3)[:2]


def far_away(height, width, rng):
    return np.array([[1.0, 0.0, 1e30], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def far_perspective(height, width, rng):  # the same shift with a perspective row: singular as far as told
    return np.array([[1.0, 0.0, 1e30], [0.0, 1.0, 0.0], [1e-3, 0.0, 1.0]])


@pytest.mark.parametrize(
    ("op", "path", "said"),
    [
        (PixelOp(boom), THREADS, r"PixelOp\(test_user_ops.boom\) raised RuntimeError: my op broke on sample \d+$"),
        (PixelOp(smaller), THREADS, r"PixelOp\(test_user_ops.smaller\) returned uint8 \[59, 80, 3\] for sample \d+"),
        (PixelOp(as_floats), THREADS, r"PixelOp\(test_user_ops.as_floats\) returned float64 \[\d+, \d+, 3\] for sample \d+"),
        (BatchOp(floats), THREADS, r"BatchOp\(test_user_ops.floats\) returned torch.float32 .* starting at sample \d+"),
        (BatchOp(floats), DEVICE, r"BatchOp\(test_user_ops.floats\) returned torch.float32 .* starting at sample \d+"),
        (MatrixOp(nan_matrix), THREADS, r"MatrixOp\(test_user_ops.nan_matrix\) returned a matrix with NaN .* sample \d+"),
        (MatrixOp(flat_matrix), DEVICE, r"MatrixOp\(test_user_ops.flat_matrix\) returned a singular matrix for sample"),
        (MatrixOp(two_by_three), THREADS, r"MatrixOp\(test_user_ops.two_by_three\) returned a \[2, 3\] array"),
        (MatrixOp(far_away), THREADS, r"far_away\) returned a matrix for sample \d+ that moves the image by 1e\+30 pixels"),
        (MatrixOp(far_perspective), THREADS, r"far_perspective\) returned a singular matrix for sample"),
    ],
)
def test_an_op_that_fails_is_one_line_naming_it_and_the_sample(cache, op, path, said):
    loader = make_loader(cache, 4, seed=SEED, augment=[*BASE, op], **path)
    with pytest.raises(UsageError, match=said) as caught:
        for _ in loader:
            pass
    assert "\n" not in str(caught.value)


def test_an_op_needs_a_function():
    with pytest.raises(TypeError, match=r"PixelOp takes a function, not int"):
        PixelOp(3)
    with pytest.raises(TypeError, match=r"BatchOp takes a function, not the class Resize"):
        BatchOp(Resize)
    with pytest.raises(ValueError, match=r"MatrixOp: size must be \(height, width\)"):
        MatrixOp(transpose, size=(0, 4))


def test_user_ops_keep_the_order_rules(cache):
    with pytest.raises(UsageError, match="BatchOp mixes whole batches"):
        make_loader(cache, 4, seed=SEED, augment=[BatchOp(halve_some), Resize((H, W))])
    with pytest.raises(UsageError, match="PixelOp runs on each sample after its geometry"):
        make_loader(cache, 4, seed=SEED, augment=[Resize((H, W)), PixelOp(mark), MatrixOp(shear)])


# -- the documented example ---------------------------------------------------------------------------

TRAINING = Path(__file__).resolve().parents[2] / "docs" / "TRAINING.md"


def test_the_documented_example_runs_as_written(cache):
    text = TRAINING.read_text(encoding="utf-8")
    section = text[text.index("### Your own ops: PixelOp, BatchOp, MatrixOp") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    for old, new in {"Resize((256, 256))": f"Resize(({H}, {W}))", '"cache/", 64': f"{str(cache.root)!r}, 4"}.items():
        assert old in code, f"TRAINING changed: {old!r} is no longer in its example"
        code = code.replace(old, new)
    runs = []
    for _ in range(2):
        scope = {}  # nothing given: the example imports what it uses
        exec(compile(code, str(TRAINING), "exec"), scope)
        runs.append([(x.clone(), t) for x, t in scope["loader"]])
    plain = _read(cache, [Resize((H, W))])
    assert len(runs[0]) == len(plain) and {tuple(x.shape) for x, _ in runs[0][:-1]} == {(4, 3, H, W)}
    assert all(torch.equal(a[0], b[0]) for a, b in zip(*runs, strict=True))  # draws from (seed, epoch, index)
    assert not any(torch.equal(a[0], b[0]) for a, b in zip(runs[0], plain))
    for _, targets in runs[0]:
        for t in targets:
            assert ((t["boxes"] >= 0) & (t["boxes"] <= torch.tensor([W, H, W, H]))).all()


# -- keypoints: moved by a MatrixOp, left alone by a PixelOp and a BatchOp ------------------------------


@pytest.fixture(scope="module")
def pose(tmp_path_factory):
    """Six 64 x 64 samples, each with two objects: a box, a class, three keypoints, and a class map."""
    rng = np.random.default_rng(11)
    samples = []
    for _ in range(6):
        image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        x0 = rng.integers(2, 20, 2).astype(np.float32)
        y0 = rng.integers(2, 20, 2).astype(np.float32)
        boxes = np.stack([x0, y0, x0 + 30, y0 + 25], 1).astype(np.float32)
        points = np.stack(
            [boxes[:, None, 0] + rng.uniform(1, 29, (2, 3)), boxes[:, None, 1] + rng.uniform(1, 24, (2, 3)),
             np.full((2, 3), 2.0)], -1,
        ).astype(np.float32)  # fmt: skip
        mask = np.zeros((64, 64), np.uint8)
        mask[int(y0[0]) : int(y0[0]) + 25, int(x0[0]) : int(x0[0]) + 30] = 1
        target = {"boxes": boxes, "classes": np.array([0, 1]), "keypoints": points, "mask": mask}
        samples.append((image, target))
    root = tmp_path_factory.mktemp("userops-pose")
    build(samples, root / "c", BuildConfig(workers=1, progress=False, pipeline="none", order="sorted"), classes=2)
    return CachedDataset(root / "c")


@pytest.mark.parametrize("path", [THREADS, DEVICE], ids=["threads", "device"])
def test_keypoints_move_with_a_matrix_op_and_stay_through_pixel_and_batch_ops(pose, path):
    keep = MatrixOp(identity, size=(64, 64))  # the samples' own size, which a loader must be told
    plain = _read(pose, [keep], batch_size=3, **path)
    ops = [BatchOp(halve_some)] if path is DEVICE else [PixelOp(mark), BatchOp(halve_some)]
    same = _read(pose, [keep, *ops], batch_size=3, **path)
    turned = _read(pose, [MatrixOp(transpose, size=(64, 64)), *ops], batch_size=3, **path)
    for (_, t0), (_, t1), (_, t2) in zip(plain, same, turned, strict=True):
        for a, b, c in zip(t0, t1, t2, strict=True):
            assert a["keypoints"].shape == (2, 3, 3)
            _same_targets([a], [b])  # a pixel op and a batch op move no target
            assert torch.equal(c["keypoints"], a["keypoints"][..., [1, 0, 2]])  # (x, y) -> (y, x)
            assert torch.equal(c["mask"], a["mask"].T)
            assert torch.equal(c["boxes"], a["boxes"][:, [1, 0, 3, 2]])


def test_an_op_that_fails_in_a_worker_process_is_still_one_line(cache):
    loader = make_loader(cache, 4, seed=SEED, augment=[*BASE, PixelOp(boom)], workers=1, threads=1, timeout=120)
    with pytest.raises(UsageError, match=r"^augment: PixelOp\(test_user_ops.boom\) raised RuntimeError: my op broke on sample \d+$"):
        next(iter(loader))


def test_a_user_op_cannot_be_given_as_text():
    from cachekit.augment.spec import format_spec, parse_spec

    with pytest.raises(UsageError, match=r"^augment spec: PixelOp wraps a Python function .* make_loader\(augment="):
        parse_spec("Resize(64), PixelOp('test_user_ops.mark')")
    text = format_spec([Resize(64), MatrixOp(shift, size=(40, 48)), PixelOp(mark), BatchOp(halve_some)])
    assert text == (
        "Resize(size=64), MatrixOp('test_user_ops.shift', size=(40, 48)), PixelOp('test_user_ops.mark'), "
        "BatchOp('test_user_ops.halve_some')"
    )


def test_an_op_that_cannot_reach_worker_processes_is_refused_when_the_loader_is_made(cache):
    def local(image, rng):  # defined inside a function: it does not pickle
        return image

    with pytest.raises(UsageError, match=r"PixelOp\(test_user_ops\..*local\) cannot be sent to the loader's worker"):
        make_loader(cache, 4, seed=SEED, augment=[*BASE, PixelOp(local)], workers=1)
    make_loader(cache, 4, seed=SEED, augment=[*BASE, PixelOp(local)], workers=0)  # in this process: fine
    loader = make_loader(cache, 4, seed=SEED, augment=BASE, workers=1)
    with pytest.raises(UsageError, match="cannot be sent to the loader's worker"):
        loader.set_augment([*BASE, MatrixOp(lambda h, w, rng: np.eye(3))])


@pytest.mark.parametrize("prefetch_thread", [True, False])
def test_a_user_op_that_never_returns_is_one_line_after_the_timeout(cache, prefetch_thread):
    """Whether a prefetch thread waits for the batch or the batch's own threads are waited on, a
    stuck op ends the pass in one line that names it among the causes, never a hang."""
    release = threading.Event()

    def stuck(image, rng):
        release.wait(60)
        return image

    loader = make_loader(cache, 4, seed=SEED, augment=[*BASE, PixelOp(stuck)], timeout=0.5,
                         prefetch_thread=prefetch_thread, **THREADS)  # fmt: skip
    try:
        with pytest.raises(ReadTimeout, match=r"in 0\.5 s: a read is stuck .* or a user op that never returns\)$"):
            next(iter(loader))
    finally:
        release.set()
