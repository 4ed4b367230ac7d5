"""``collate="yolo"`` with a per-sample ``transforms=``: the pose batch (``keypoints`` ``[M, K, 3]``,
normalised as Ultralytics') comes from the points the transform returns, as from augmented batches;
a transform that drops the cache's keypoints, or returns other than one block per box, is one line.

The transform here mirrors each image and pads it on the right: each point must land, normalised
to the padded size, on the dot drawn for the point it was mirrored from."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, UsageError, build, make_loader

H, W, K, SAMPLES, PAD = 40, 56, 3, 4, 16
FLIP = [0, 2, 1]  # nose, left, right
QUIET = {"workers": 1, "progress": False, "pipeline": "none", "strict": True, "order": "sorted"}


def _colour(s: int, o: int, p: int) -> np.ndarray:
    n = (s * 2 + o) * K + p
    return np.array([60 + 7 * n, 250 - 6 * n, 100 + (37 * n) % 150], np.uint8)


def _samples():
    """Two objects a sample (classes ``2s``, ``2s + 1``), each three points drawn as 3x3 dots."""
    rng = np.random.default_rng(8)
    out = []
    for s in range(SAMPLES):
        image = np.zeros((H, W, 3), np.uint8)
        boxes, points = [], []
        for o in range(2):
            xs, ys = (
                4 + 8 * (rng.choice(3, K, replace=False) + 3 * o),
                4 + 8 * rng.choice(4, K, replace=False),
            )
            for p, (x, y) in enumerate(zip(xs, ys)):
                image[y - 1 : y + 2, x - 1 : x + 2] = _colour(s, o, p)
            boxes.append([xs.min() - 2, ys.min() - 2, xs.max() + 3, ys.max() + 3])
            points.append(np.stack([xs + 0.5, ys + 0.5, np.array([2.0, 1.0, 2.0])], 1))
        target = {"boxes": np.array(boxes, np.float32), "classes": np.array([2 * s, 2 * s + 1]),
                  "keypoints": np.array(points, np.float32)}  # fmt: skip
        out.append((image, target))
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("pose") / "c"
    build(_samples(), path, BuildConfig(**QUIET), classes=2 * SAMPLES, flip_idx=FLIP)
    return path


def mirror_and_pad(image: torch.Tensor, target: dict):
    """A user's per-sample transform: mirror, then pad ``PAD`` columns on the right; boxes and
    points follow (left and right points swapped)."""
    image = torch.nn.functional.pad(image.flip(-1), (0, PAD))
    boxes = target["boxes"].clone()
    boxes[:, [0, 2]] = W - target["boxes"][:, [2, 0]]
    points = target["keypoints"][:, FLIP].clone()
    points[..., 0] = W - points[..., 0]
    return image, {**target, "boxes": boxes, "keypoints": points}


def mirror_and_pad_by_sample(image: torch.Tensor, target: dict):
    """``mirror_and_pad``, then 8 more columns for odd samples: a batch of two sizes, padded."""
    image, target = mirror_and_pad(image, target)
    return torch.nn.functional.pad(image, (0, 8 * (int(target["classes"][0]) // 2 % 2))), target


def drop_points(image: torch.Tensor, target: dict):
    return image, {k: v for k, v in target.items() if k != "keypoints"}


def one_point_block_short(image: torch.Tensor, target: dict):
    return image, {**target, "keypoints": target["keypoints"][:1]}


@pytest.mark.parametrize("pad", [False, True])
def test_the_pose_batch_comes_from_the_points_a_transform_returns(cache, pad):
    """Normalised to the batch's size: with ``pad``, samples of two widths padded to the wider, as a
    loss on the padded batch reads them."""
    ds = CachedDataset(cache, transforms=mirror_and_pad_by_sample if pad else mirror_and_pad)
    loader = make_loader(
        ds, 4 if pad else 3, seed=2, workers=0, collate="yolo", pad=pad
    )  # pad: one batch, both sizes
    original = {2 * s + o: t["keypoints"][o] for s, (_, t) in enumerate(_samples()) for o in range(2)}
    seen = 0
    for batch in loader:
        images, got = batch[0], batch[1]
        assert isinstance(got, dict) and set(got) == {"batch_idx", "cls", "bboxes", "keypoints"}
        points = got["keypoints"]
        assert points.dtype == torch.float32 and points.shape == (len(got["cls"]), K, 3)
        width = images.shape[-1]
        assert images.shape[-2] == H and width == W + PAD + (8 if pad else 0)
        for b, c, pts in zip(
            got["batch_idx"].long().tolist(), got["cls"][:, 0].long().tolist(), points.numpy()
        ):
            s, o = divmod(c, 2)
            was = original[c][FLIP]
            want = np.stack([(W - was[:, 0]) / width, was[:, 1] / H, was[:, 2]], 1)
            np.testing.assert_allclose(pts, want, rtol=1e-6)
            for i, (x, y, _) in enumerate(pts):  # the dot under each point is the one it was mirrored from
                pixel = images[b][:, int(y * H), int(x * width)].numpy()
                assert (pixel == _colour(s, o, FLIP[i])).all()
            seen += 1
    assert seen == 2 * SAMPLES


@pytest.mark.parametrize("workers", [0, 1])
def test_a_transform_that_drops_the_keypoints_or_a_block_is_one_line(cache, workers):
    """In this process or in a worker process (the default with a transform), the same one line."""
    dropped = make_loader(CachedDataset(cache, transforms=drop_points), 2, workers=workers, collate="yolo")
    with pytest.raises(UsageError) as err:
        next(iter(dropped))
    assert str(err.value) == (
        "collate=\"yolo\": this cache has keypoints ('keypoints'), and the targets your transform returned lack "
        "them: return target['keypoints'] moved with the image ([N, K, 3]), or use collate=\"auto\""
    )
    short = make_loader(
        CachedDataset(cache, transforms=one_point_block_short), 2, workers=workers, collate="yolo"
    )
    with pytest.raises(ValueError) as err:
        next(iter(short))
    assert str(err.value) == (
        "collate=\"yolo\": sample 0 of the batch has 2 boxes and 'keypoints' of shape [1, 3, 3] from your "
        "transform; Ultralytics' pose batch needs [2, 3, 3], one block of points per box"
    )


def test_a_collate_made_without_the_cache_s_fields_reads_k_from_the_points(cache):
    from cachekit.feed.batch import Collate

    ds = CachedDataset(cache, transforms=mirror_and_pad)
    got = Collate(targets="yolo")([ds[0], ds[1]])[1]
    assert got["keypoints"].shape == (4, K, 3) and got["batch_idx"].tolist() == [0, 0, 1, 1]
    assert Collate(targets="yolo")([drop_points(*CachedDataset(cache)[0])])[1].shape == (
        2,
        6,
    )  # rows, as before
