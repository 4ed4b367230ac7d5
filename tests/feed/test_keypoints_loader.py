"""Keypoints move with the pixels: every geometric transform, on the threads and on the device path
(run on the CPU). Each image has a dot of its own colour drawn at each keypoint; after the
transform the dot must lie under its moved point (within 1 px), or the point is marked visibility 0
when it left the output. A mirror swaps left and right points by ``flip_idx``; an object dropped
by ``min_visibility`` drops its keypoints with its box."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.transforms import (
    CenterCrop,
    Letterbox,
    MatrixOp,
    MixUp,
    Mosaic,
    RandAugment,
    RandomAffine,
    RandomHorizontalFlip,
    RandomIoUCrop,
    RandomPerspective,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    Resize,
)

H, W, K, SAMPLES = 96, 128, 4, 8
FLIP_IDX = [1, 0, 3, 2]  # left_eye, right_eye, left_hand, right_hand
NAMES = ["left_eye", "right_eye", "left_hand", "right_hand"]
R = 3  # a dot is a 7x7 square round its point
#: Distinct saturated colours (one channel at 255): a dot dimmed or blended with the background
#: never passes for another dot's colour.
COLOURS = np.array(
    [c for c in itertools.product((0, 48, 96, 144, 192, 255), repeat=3) if max(c) == 255], dtype=np.int64
)
QUIET = {"workers": 1, "progress": False, "pipeline": "none", "strict": True, "order": "sorted"}
PATHS = {"threads": {"augment_on": "threads"}, "device": {"device": "cpu", "augment_on": "device"}}


def _samples(masks: bool = False):
    """Eight images, each with two objects of four points (object 0 on the left half, object 1 on
    the right), each object of its own class, each point a dot of its own colour."""
    rng = np.random.default_rng(5)
    out = []
    for s in range(SAMPLES):
        image = np.zeros((H, W, 3), np.uint8)
        boxes, points = [], []
        for o in range(2):
            cols = rng.choice(4, K, replace=True) + 4 * o
            rows = rng.choice(6, K, replace=False)
            gx, gy = 8 + 16 * cols, 8 + 16 * rows
            pts = np.stack([gx + 0.5, gy + 0.5, np.full(K, 2.0)], 1)
            for p, (x, y) in enumerate(zip(gx, gy)):
                image[y - R : y + R + 1, x - R : x + R + 1] = COLOURS[(2 * s + o) * K + p]
            boxes.append(
                [max(gx.min() - 4, 0), max(gy.min() - 4, 0), min(gx.max() + 5, W), min(gy.max() + 5, H)]
            )
            points.append(pts)
        target = {
            "boxes": np.array(boxes, np.float32),
            "classes": np.array([2 * s, 2 * s + 1]),
            "keypoints": np.array(points, np.float32),
        }
        if masks:  # a class map: each object's box filled with its class + 1
            target["mask"] = np.zeros((H, W), np.uint8)
            for c, (x0, y0, x1, y1) in zip(target["classes"], target["boxes"].astype(int)):
                target["mask"][y0:y1, x0:x1] = c + 1
        out.append((image, target))
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("kp")
    build(_samples(), root / "c", BuildConfig(**QUIET), classes=2 * SAMPLES)
    _with_flip_idx(root / "c")
    return root / "c"


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    """The same samples with a class map each: their targets go through the loader's other path."""
    root = tmp_path_factory.mktemp("kpm")
    build(_samples(masks=True), root / "c", BuildConfig(**QUIET), classes=2 * SAMPLES)
    _with_flip_idx(root / "c")
    return root / "c"


def _with_flip_idx(path):
    """The cache's keypoints field given names and flip_idx, as a COCO or YOLO pose source gives them."""
    import json

    from manifests import listed_manifest

    manifest = listed_manifest(path)
    field = manifest["sample"]["fields"]["keypoints"]
    field.update(flip_idx=FLIP_IDX, names=NAMES)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _uint8(images: torch.Tensor) -> np.ndarray:
    x = images.float()
    if x.max() <= 1.0 + 1e-6:
        x = x * 255
    return x.round().clamp(0, 255).to(torch.uint8).numpy()


def _blob(image: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """``[n, 2]`` (x, y) centres of the pixels of ``colour`` (within 20 a channel) in ``[C, H, W]``."""
    close = (np.abs(image.astype(np.int64) - colour[:, None, None]) <= 20).all(0)
    ys, xs = np.nonzero(close)
    return np.stack([xs + 0.5, ys + 0.5], 1)


def _check_batch(images: np.ndarray, targets: list[dict], absent: bool = True) -> tuple[int, int]:
    """Every moved point against its dot; returns (points seen under their dots, mirrored objects).
    ``absent``: a point of visibility 0 has no whole dot in the output (not so in a mosaic, which
    may hold one image twice: the dot cut from one tile is whole in the other)."""
    seen = mirrored = 0
    for image, t in zip(images, targets):
        boxes, classes, points = t["boxes"].numpy(), t["classes"].numpy(), t["keypoints"].numpy()
        assert points.dtype == np.float32 and points.shape == (len(boxes), K, 3)
        h, w = image.shape[1:]
        for o, pts in zip(classes.tolist(), points):
            fits = []
            for perm in (list(range(K)), FLIP_IDX):
                ok = True
                for i, (x, y, v) in enumerate(pts):
                    found = _blob(image, COLOURS[o * K + perm[i]])
                    if v > 0:
                        assert 0 <= x <= w and 0 <= y <= h
                        # the pixel under the point is the dot's, and (a whole dot) its centre is the point
                        ok &= len(found) > 0 and bool((np.abs(found - (x, y)).max(1) <= 1.0).any())
                        whole = min(x, y, w - x, h - y) > 2 * R + 2
                        local = found[np.abs(found - (x, y)).max(1) <= 2 * R + 2]  # its own dot
                        ok &= not whole or (
                            len(local) > 0 and bool(np.abs(local.mean(0) - (x, y)).max() <= 1.0)
                        )
                    elif len(found) and absent:  # out of the output: at most a cut dot at its edge
                        margin = 2 * R + 2
                        inner = found[:, 0].clip(0) > margin, found[:, 0] < w - margin
                        inner = inner[0] & inner[1] & (found[:, 1] > margin) & (found[:, 1] < h - margin)
                        ok &= not inner.any()
                fits.append(ok)
            assert any(fits), f"object {o}: its dots are not under its points {pts.tolist()}"
            if not fits[0]:
                mirrored += 1
            seen += int((pts[:, 2] > 0).sum())
    return seen, mirrored


def _mirror_shear(height, width, rng):
    """A user's map: a horizontal mirror with a drawn shear and shift (continuous coordinates)."""
    return np.array([[-1.0, rng.uniform(-0.2, 0.2), width - 8.0], [0.0, 0.9, rng.uniform(-4, 4)], [0, 0, 1]])


SAME = CenterCrop((H, W))  # the whole image: a fixed output size for a cache of samples of their own size
CASES = {
    "rrc+flip": [RandomResizedCrop(96, scale=(0.5, 1.0)), RandomHorizontalFlip()],
    "hflip": [RandomHorizontalFlip(p=1.0), SAME],
    "vflip": [RandomVerticalFlip(p=1.0), SAME],
    "affine": [RandomAffine(degrees=20, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=10), SAME],
    "rotation": [RandomRotation(30), SAME],
    "perspective": [RandomPerspective(distortion_scale=0.3, p=1.0), SAME],
    "letterbox": [Letterbox(112)],
    "mosaic": [Mosaic(96), RandomHorizontalFlip()],
    "mosaic+affine": [Mosaic(96), RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.8, 1.2))],
    "ioucrop": [RandomIoUCrop(), Resize((96, 96)), RandomHorizontalFlip()],
    "matrixop": [MatrixOp(_mirror_shear, size=(80, 112))],
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(CASES))
def test_a_dot_at_each_keypoint_lands_under_its_moved_point(cache, case, path):
    _dots_under_points(cache, case, path)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", ["rrc+flip", "affine", "mosaic+affine", "ioucrop"])
def test_with_masks_too_the_dots_land_under_the_points(masked, case, path):
    _dots_under_points(masked, case, path)


def _dots_under_points(cache, case, path):
    loader = make_loader(cache, 4, seed=3, augment=CASES[case], min_visibility=0.0, threads=1, **PATHS[path])
    seen = mirrored = 0
    for _ in range(2):  # two epochs
        for batch in loader:
            s, m = _check_batch(_uint8(batch[0]), batch[1], absent="mosaic" not in case)
            seen, mirrored = seen + s, mirrored + m
    assert seen >= 2 * SAMPLES * K  # most points stay in view: the check is not vacuous
    if case in ("hflip", "vflip", "matrixop"):  # every object mirrored: left and right swapped
        assert mirrored == 2 * 2 * SAMPLES
    elif case in ("letterbox", "rotation", "perspective"):
        assert mirrored == 0
    elif case in ("rrc+flip", "mosaic"):  # flipped by chance: some, not all
        assert 0 < mirrored < seen / K


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The samples in four shards of two, in shuffled order: a shuffled batch reads several shards."""
    root = tmp_path_factory.mktemp("kps")
    config = BuildConfig(**{**QUIET, "order": "shuffled", "shard_size": 2})
    build(_samples(), root / "c", config, classes=2 * SAMPLES)
    _with_flip_idx(root / "c")
    return root / "c"


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("flip", [False, True], ids=["as-stored", "flipped"])
def test_a_shuffled_batch_of_several_shards_gives_each_object_its_own_points(sharded, flip, path):
    # a class names one object of one sample: its points are that object's, whatever shards the batch reads
    own = {int(c): p for _, t in _samples() for c, p in zip(t["classes"], t["keypoints"])}
    assert len(CachedDataset(sharded).manifest.shards) == 4
    augment = [RandomHorizontalFlip(p=1.0), SAME] if flip else [SAME]
    loader = make_loader(sharded, 4, seed=5, augment=augment, workers=0, threads=1, **PATHS[path])
    checked, wrong = 0, []
    for _ in range(2):  # two epochs, two orders
        for _, targets in loader:
            for t in targets:
                for c, pts in zip(t["classes"].tolist(), t["keypoints"].numpy()):
                    want = own[c][FLIP_IDX] * (-1, 1, 1) + (W, 0, 0) if flip else own[c]
                    checked += 1
                    if not np.allclose(pts, want, atol=1e-3):
                        wrong.append(c)
    assert checked == 2 * 2 * SAMPLES
    assert not wrong, f"{len(wrong)} of {checked} objects (classes {wrong}) carry another object's points"


def test_a_flip_swaps_left_and_right_by_flip_idx(cache):
    stored = CachedDataset(cache)[0][1]["keypoints"].numpy()
    batch = next(
        iter(make_loader(cache, 1, shuffle=False, augment=[RandomHorizontalFlip(p=1.0), SAME], threads=1))
    )
    moved = batch[1][0]["keypoints"].numpy()
    np.testing.assert_allclose(moved[:, :, 0], W - stored[:, FLIP_IDX, 0])
    np.testing.assert_allclose(moved[:, :, 1], stored[:, FLIP_IDX, 1])


@pytest.mark.parametrize("path", list(PATHS))
def test_an_object_dropped_by_min_visibility_drops_its_keypoints(cache, path):
    """The same draws with min_visibility 0 and 0.5: the objects the second drops take their points
    with them; each object kept has the very points it has in the first."""
    augment = [RandomResizedCrop(64, scale=(0.3, 0.7)), RandomHorizontalFlip()]

    def objects(visibility):
        loader = make_loader(cache, 4, seed=11, augment=augment, min_visibility=visibility, threads=1,
                             shuffle=False, **PATHS[path])  # fmt: skip
        out = {}
        for b, batch in enumerate(loader):
            for j, t in enumerate(batch[1]):
                assert len(t["keypoints"]) == len(t["boxes"]) == len(t["classes"])
                for c, pts in zip(t["classes"].tolist(), t["keypoints"].numpy()):
                    out[(b, j, c)] = pts
        return out

    every, kept = objects(0.0), objects(0.5)
    assert set(kept) < set(every) and kept  # some dropped, some kept
    for key, pts in kept.items():
        np.testing.assert_array_equal(pts, every[key])


def _points_inside_their_boxes(targets: list[dict]) -> int:
    """Each target's points one block per box, every visible point inside its object's box."""
    inside = 0
    for t in targets:
        boxes, points = np.asarray(t["boxes"]), np.asarray(t["keypoints"])
        assert points.shape == (len(boxes), K, 3) and len(t["classes"]) == len(boxes)
        for box, pts in zip(boxes, points):
            seen = pts[pts[:, 2] > 0]
            assert (seen[:, 0] >= box[0] - 0.5).all() and (seen[:, 0] <= box[2] + 0.5).all()
            assert (seen[:, 1] >= box[1] - 0.5).all() and (seen[:, 1] <= box[3] + 0.5).all()
            inside += len(seen)
    return inside


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("which", ["plain", "masked"])
def test_mixup_gives_each_sample_its_neighbours_points_with_its_boxes(cache, masked, which, path):
    source = cache if which == "plain" else masked
    augment = [RandomResizedCrop(96, scale=(0.5, 1.0)), RandomHorizontalFlip(), MixUp(p=1.0)]
    loader = make_loader(source, 4, seed=1, augment=augment, threads=1, **PATHS[path])
    grown = 0
    for batch in loader:
        assert _points_inside_their_boxes(batch[1]) > 0
        grown += sum(len(set(t["classes"].tolist())) > 2 for t in batch[1])
    assert grown  # mixed samples carry two images' objects, and their points


@pytest.mark.parametrize("which", ["plain", "masked"])
def test_randaugment_moves_points_with_the_boxes_it_moves(cache, masked, which):
    source = cache if which == "plain" else masked
    augment = [CenterCrop((H, W)), RandAugment(num_ops=2, magnitude=15)]
    loader = make_loader(source, 4, seed=2, augment=augment, min_visibility=0.3, threads=1)
    plain = make_loader(source, 4, seed=2, augment=[CenterCrop((H, W))], threads=1)
    moved = 0
    for _ in range(3):
        for batch, before in zip(loader, plain):
            assert _points_inside_their_boxes(batch[1]) > 0
            moved += sum(
                not np.array_equal(np.asarray(a["keypoints"]), np.asarray(b["keypoints"]))
                for a, b in zip(batch[1], before[1])
            )
    assert moved  # its shears, translations and rotations moved some


@pytest.mark.parametrize("path", list(PATHS))
def test_collate_yolo_gives_ultralytics_pose_batch_normalised(cache, path):
    augment = [RandomResizedCrop((64, 96), scale=(0.5, 1.0)), RandomHorizontalFlip()]
    auto = make_loader(cache, 4, seed=4, augment=augment, threads=1, **PATHS[path])
    yolo = make_loader(cache, 4, seed=4, augment=augment, threads=1, collate="yolo", **PATHS[path])
    for a, y in zip(auto, yolo):
        t = y[1]
        assert set(t) == {"batch_idx", "cls", "bboxes", "keypoints"}
        assert t["keypoints"].dtype == torch.float32 and t["keypoints"].shape[1:] == (K, 3)
        want = torch.cat([s["keypoints"] for s in a[1]]) / torch.tensor([96.0, 64.0, 1.0])  # x / w, y / h
        torch.testing.assert_close(t["keypoints"], want)
        idx = torch.cat([torch.full((len(s["boxes"]),), float(i)) for i, s in enumerate(a[1])])
        torch.testing.assert_close(t["batch_idx"], idx)
        torch.testing.assert_close(t["cls"][:, 0], torch.cat([s["classes"] for s in a[1]]).float())
        boxes = torch.cat([s["boxes"] for s in a[1]])
        centre = (boxes[:, :2] + boxes[:, 2:]) / 2 / torch.tensor([96.0, 64.0])
        torch.testing.assert_close(t["bboxes"][:, :2], centre)


def test_collate_yolo_leaves_a_crowd_objects_points_out_with_its_box():
    from cachekit.feed.targets import yolo_batch
    from cachekit.store.fields import FieldSpec

    fields = {"boxes": FieldSpec("boxes"), "keypoints": FieldSpec("keypoints", {"boxes": "boxes", "k": 1})}
    targets = [
        {
            "boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [10.0, 0.0, 20.0, 20.0]]),
            "classes": torch.tensor([3, 4]),
            "iscrowd": torch.tensor([1, 0], dtype=torch.uint8),
            "keypoints": torch.tensor([[[5.0, 5.0, 2.0]], [[15.0, 10.0, 1.0]]]),
        }
    ]
    out = yolo_batch(fields, targets, [(20, 40)])
    assert out["cls"].tolist() == [[4.0]]
    torch.testing.assert_close(out["keypoints"], torch.tensor([[[15 / 40, 10 / 20, 1.0]]]))
    torch.testing.assert_close(out["bboxes"], torch.tensor([[15 / 40, 10 / 20, 10 / 40, 20 / 20]]))


@pytest.mark.parametrize("path", list(PATHS))
def test_a_mirror_of_points_without_flip_idx_warns_once(tmp_path, monkeypatch, path):
    """A pose cache with no flip_idx (a data.yaml without one): a flip keeps each point's index, so a
    left wrist is labelled on the right; Ultralytics turns its flips off, the loader says so once.
    No warning without a mirror, nor with a flip_idx."""
    import warnings

    from cachekit.image import instances

    build(_samples()[:4], tmp_path / "c", BuildConfig(**QUIET), classes=2 * SAMPLES)
    assert "flip_idx" not in CachedDataset(tmp_path / "c").manifest.sample.fields["keypoints"].params

    def run(source, augment):
        monkeypatch.setattr(instances, "_warned_unpaired", False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                for _batch in make_loader(source, 2, seed=1, augment=augment, threads=1, **PATHS[path]):
                    pass
        return [str(w.message) for w in caught if "flip_idx" in str(w.message)]

    said = run(tmp_path / "c", [RandomHorizontalFlip(p=1.0), SAME])
    assert len(said) == 1 and "were mirrored by a flip, and their field has no flip_idx" in said[0]
    assert run(tmp_path / "c", [RandomVerticalFlip(p=1.0), SAME])  # a mirror too
    assert not run(tmp_path / "c", [RandomRotation(30), SAME])
    _with_flip_idx(tmp_path / "c")
    assert not run(tmp_path / "c", [RandomHorizontalFlip(p=1.0), SAME])
