"""A transform is a class of the protocol and nothing else: one defined here, in this file alone, runs.

A pixel transform gives its row kernel and its batch kernel (``draw_stage``), a geometric one each
sample's map (``draw_matrices``); the plan, the order check and the loader need no edit for them,
and what they do to each target follows from their kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.devicework import DeviceWork
from cachekit.augment.draws import uniforms
from cachekit.augment.plan import compile_plan
from cachekit.augment.protocol import Geometric, Pixel
from cachekit.errors import UsageError
from cachekit.feed.assemble import BatchRequest
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import CenterCrop, RandomHorizontalFlip, Resize


@dataclass(frozen=True)
class _InvertDraws:
    chosen: np.ndarray

    def matrices(self, j: int) -> list:
        return []

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        if self.chosen[j]:
            np.subtract(255, chw, out=chw)

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        chosen = torch.from_numpy(self.chosen).to(x.device).view(-1, 1, 1, 1)
        return torch.where(chosen, 255.0 - x, x)


@dataclass(frozen=True)
class RandomInvert(Pixel):
    """With probability ``p``, every pixel value v becomes 255 - v."""

    p: float = 0.5

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        return _InvertDraws(uniforms(seed, epoch, idx, stream, 1)[:, 0] < self.p)


@dataclass(frozen=True)
class Transpose(Geometric):
    """Rows become columns."""

    GENERAL = True

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        m = np.tile(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), (len(idx), 1, 1))
        return m, vw, vh

    def fixed_size(self, size):
        return None if size is None else (size[1], size[0])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("protocol")
    raw = make_object_dataset(tmp / "raw", 8, size=(60, 80), classes=3, seed=2)
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


def _read(ds, augment, **options):
    loader = make_loader(ds, 4, seed=3, augment=augment, shuffle=False, **options)
    return [(x.clone(), t) for x, t in loader]


@pytest.mark.parametrize(
    "path", [{"augment_on": "threads"}, {"device": "cpu", "augment_on": "device"}], ids=["threads", "device"]
)
def test_a_transform_defined_outside_the_package_runs_by_its_kind(cache, path):
    crop = CenterCrop((48, 32))
    plain = _read(cache, [crop], **path)
    got = _read(cache, [crop, Transpose(), RandomInvert(p=0.5)], **path)
    inverted = []
    for (x0, t0), (x1, t1) in zip(plain, got, strict=True):
        assert x1.shape[-2:] == (32, 48)
        for a, b, ta, tb in zip(x0, x1, t0, t1, strict=True):
            turned = a.transpose(-1, -2)
            assert torch.equal(b, turned) or torch.equal(b, 255 - turned)
            inverted.append(not torch.equal(b, turned))
            assert torch.equal(tb["mask"], ta["mask"].T)  # the map moves the mask; the inversion does not
            assert torch.equal(tb["boxes"], ta["boxes"][:, [1, 0, 3, 2]])
    assert 0 < sum(inverted) < len(inverted)


def test_the_order_rules_follow_the_kind(cache):
    with pytest.raises(UsageError, match="RandomInvert runs on each sample after its geometry"):
        make_loader(cache, 4, augment=[CenterCrop(48), RandomInvert(), Transpose()])
    # a per-pixel op listed before a mirror is taken as written only when it says it is one
    with pytest.raises(UsageError, match="list it after RandomHorizontalFlip"):
        make_loader(cache, 4, augment=[CenterCrop(48), RandomInvert(), RandomHorizontalFlip()])


@pytest.mark.parametrize(
    ("augment", "geometry"),
    [([CenterCrop(48), RandomHorizontalFlip()], "boxes"), ([CenterCrop((48, 32)), Transpose()], "matrices")],
    ids=["crop", "map"],
)
def test_the_device_path_gets_a_typed_object_that_does_the_work(cache, augment, geometry):
    plan = compile_plan([*augment, RandomInvert(p=1.0)])
    batch = cache.read_request(BatchRequest([0, 1, 2], epoch=1, seed=3, plan=plan, on_device=True))
    work = batch.aux
    assert isinstance(work, DeviceWork) and work.stage is not None and work.mix is None
    assert getattr(work, geometry) is not None and len(getattr(work, geometry)) == 3
    assert work.jitter is None and work.hue is False
    out = work.to(torch.device("cpu")).apply(batch.images)
    threads = cache.read_request(BatchRequest([0, 1, 2], epoch=1, seed=3, plan=plan)).images
    assert out.shape == threads.shape and (out.round() - threads.float()).abs().max() <= 1


def _pose_samples():
    """Four 40x56 images, each with two objects: a box, three points (x, y, visibility), and a class
    map filled under each box with its class + 1."""
    rng = np.random.default_rng(3)
    out = []
    for s in range(4):
        image = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
        boxes = np.array([[4, 6, 20, 30], [30, 10, 50, 34]], np.float32) + s
        points = np.stack([np.stack([b[[0, 2, 0]] + [1, -1, 3], b[[1, 1, 3]] + [2, 3, -2], [2, 1, 2]], 1) for b in boxes])
        mask = np.zeros((40, 56), np.uint8)
        for c, (x0, y0, x1, y1) in enumerate(boxes.astype(int)):
            mask[y0:y1, x0:x1] = c + 1
        out.append((image, {"boxes": boxes, "classes": np.array([0, 1]), "keypoints": points.astype(np.float32),
                            "mask": mask}))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def pose(tmp_path_factory):
    root = tmp_path_factory.mktemp("protocol_pose")
    build(_pose_samples(), root / "c", BuildConfig(workers=1, progress=False, pipeline="none", strict=True), classes=2)
    return CachedDataset(root / "c")


@pytest.mark.parametrize(
    "path", [{"augment_on": "threads"}, {"device": "cpu", "augment_on": "device"}], ids=["threads", "device"]
)
def test_a_transform_of_this_file_moves_boxes_masks_and_keypoints_alike(pose, path):
    """``Transpose`` and ``RandomInvert`` (this file's) on a cache of boxes, masks and keypoints: the
    map moves every target (a point's x and y swap, its visibility kept; the box and the class map
    turn with it); the inversion moves none."""
    import warnings

    size = Resize((40, 56))  # each sample's own size: the map starts as it is
    plain = _read(pose, [size], **path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a mirror without flip_idx: said once, points keep their indices
        got = _read(pose, [size, Transpose(), RandomInvert(p=0.5)], **path)
    for (x0, t0), (x1, t1) in zip(plain, got, strict=True):
        for a, b, ta, tb in zip(x0, x1, t0, t1, strict=True):
            turned = a.transpose(-1, -2)
            assert torch.equal(b, turned) or torch.equal(b, 255 - turned)
            assert torch.equal(tb["mask"], ta["mask"].T)
            assert torch.equal(tb["boxes"], ta["boxes"][:, [1, 0, 3, 2]])
            assert torch.equal(tb["keypoints"], ta["keypoints"][..., [1, 0, 2]])
            assert tb["classes"].tolist() == ta["classes"].tolist() == [0, 1]
