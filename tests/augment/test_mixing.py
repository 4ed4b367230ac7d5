"""MixUp and CutMix: lambda ~ Beta(alpha, alpha) (KS), CutMix's box area = 1 - lambda, the batch mixed with
its roll by one, soft labels, Ultralytics' detection MixUp keeping both samples' boxes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cachekit.augment.mixing import compile_mixing
from cachekit.image.instances import Instances
from cachekit.store.fields import FieldSpec
from cachekit.transforms import CutMix, MixUp, MixUpOrCutMix

BATCHES = 2000


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function, by its continued fraction (Lentz's method)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = (
        math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
        / a
    )
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1.0 + num / (c if abs(c) > 1e-300 else 1e-300)
        f *= c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return front * (f - 1.0)


def _beta_cdf(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """The Beta CDF: scipy's when it is installed, else the incomplete beta function's continued fraction."""
    try:
        from scipy.stats import beta

        return beta.cdf(x, a, b)
    except ImportError:
        return np.array([_betainc(a, b, float(v)) for v in x])


def _ks(samples: np.ndarray, a: float, b: float) -> float:
    x = np.sort(samples)
    cdf = _beta_cdf(x, a, b)
    n = len(x)
    return float(max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max()))


def _lams(mix, kind: str, hw=(32, 48)) -> tuple[np.ndarray, list]:
    draws = [mix.draw(5, 1, [1000 + 16 * b], hw, detection=False) for b in range(BATCHES)]
    return np.array([d.lam for d in draws if d.kind == kind]), [d for d in draws if d.kind == kind]


@pytest.mark.parametrize("alpha", [0.2, 1.0, 3.0])
def test_mixup_lambda_is_beta(alpha):
    lams, _ = _lams(compile_mixing([MixUp(alpha)]), "mixup")
    assert len(lams) == BATCHES
    assert _ks(lams, alpha, alpha) < 1.95 / math.sqrt(len(lams))  # KS at the 0.1% level
    assert _ks(lams, alpha * 3, alpha * 3) > 1.95 / math.sqrt(len(lams))  # the test can tell


def test_cutmix_box_area_is_one_minus_lambda_and_lambda_is_beta():
    h, w = 32, 48
    _, draws = _lams(compile_mixing([CutMix(1.0)]), "cutmix", (h, w))
    assert len(draws) == BATCHES
    for d in draws:
        y1, y2, x1, x2 = d.box
        assert 0 <= y1 <= y2 <= h and 0 <= x1 <= x2 <= w
        assert math.isclose((y2 - y1) * (x2 - x1) / (h * w), 1 - d.lam, abs_tol=1e-12)
    # the kept share against torchvision's CutMix run on the same sizes (lambda ~ Beta(1, 1), a uniform
    # centre, half sides int(0.5 * sqrt(1 - lambda) * side), clipped): a two-sample KS test
    rng = np.random.default_rng(0)
    reference = []
    for lam in rng.beta(1.0, 1.0, 4 * BATCHES):
        cx, cy = rng.integers(w), rng.integers(h)
        r = 0.5 * math.sqrt(1.0 - lam)
        x1, x2 = max(cx - int(r * w), 0), min(cx + int(r * w), w)
        y1, y2 = max(cy - int(r * h), 0), min(cy + int(r * h), h)
        reference.append(1.0 - (x2 - x1) * (y2 - y1) / (w * h))
    ours, theirs = np.sort([d.lam for d in draws]), np.sort(reference)
    grid = np.concatenate([ours, theirs])
    ks = np.abs(
        np.searchsorted(ours, grid, "right") / len(ours)
        - np.searchsorted(theirs, grid, "right") / len(theirs)
    )
    assert ks.max() < 1.95 * math.sqrt(1 / len(ours) + 1 / len(theirs))


def test_mixup_or_cutmix_switches_with_its_probability():
    mix = compile_mixing([MixUpOrCutMix(switch_prob=0.3, p=0.8)])
    kinds = [mix.draw(0, 0, [i * 8], (16, 16), detection=False).kind for i in range(BATCHES)]
    counts = {k: kinds.count(k) for k in ("mixup", "cutmix", "none")}
    assert abs(counts["none"] / BATCHES - 0.2) < 0.04
    assert abs(counts["cutmix"] / BATCHES - 0.8 * 0.3) < 0.04
    both = compile_mixing([MixUp(), CutMix()])  # listed together: one chosen per batch, even odds
    kinds = [both.draw(0, 0, [i * 8], (16, 16), detection=False).kind for i in range(BATCHES)]
    assert abs(kinds.count("cutmix") / BATCHES - 0.5) < 0.04 and kinds.count("none") == 0


def test_images_and_labels_mixed_with_the_roll_by_one():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 3, 16, 20), dtype=np.uint8)
    labels = np.array([0, 3, 1, 1, 2, 3])
    for steps in ([MixUp(0.5)], [CutMix(2.0)]):
        mix = compile_mixing(steps)
        d = next(d for d in (mix.draw(1, 0, [i], (16, 20), False) for i in range(100)) if 0.1 < d.lam < 0.9)
        out = np.empty_like(images)
        for j in range(6):
            d.mix_row(images, out, j)
        rolled = np.roll(images, 1, axis=0).astype(np.float64)
        if d.kind == "mixup":
            want = np.round(d.lam * images + (1 - d.lam) * rolled)
            assert np.abs(out - want).max() <= 1
        else:
            y1, y2, x1, x2 = d.box
            want = images.copy()
            want[:, :, y1:y2, x1:x2] = rolled[:, :, y1:y2, x1:x2]
            assert np.array_equal(out, want)
        batched = d.apply_batch(torch.from_numpy(images).float())
        assert (batched - torch.from_numpy(out).float()).abs().max() <= 1
        soft = d.soft_labels(labels, 4)
        assert soft.shape == (6, 4) and soft.dtype == np.float32 and np.allclose(soft.sum(1), 1)
        one = np.eye(4)[labels]
        assert np.allclose(soft, d.lam * one + (1 - d.lam) * np.roll(one, 1, axis=0))
        with pytest.raises(ValueError, match="num_classes"):
            d.soft_labels(labels, 3)


def _mixed(d, targets: list[dict], masks: dict) -> list[dict]:
    """``targets`` (one dict of boxes, classes[, iscrowd] per sample) as the carrier holds them, mixed
    by ``d`` (objects and masks), back as per-sample dicts of numpy arrays."""
    n = len(targets)
    owner = np.concatenate([np.full(len(t["classes"]), j) for j, t in enumerate(targets)]).astype(np.int64)
    crowd = [t.get("iscrowd", torch.zeros(len(t["classes"]))) for t in targets]
    objects = Instances(
        torch.cat([t["boxes"] for t in targets]).numpy(), torch.cat([t["classes"] for t in targets]).numpy(),
        torch.cat(crowd).numpy(), owner,
    )  # fmt: skip
    d.mix_masks(masks)
    mixed = d.mix_objects(objects, n)
    return [{"boxes": mixed.boxes[a:b], "classes": mixed.classes[a:b]} for a, b in mixed.spans(n)]


def test_detection_mixup_is_ultralytics_and_keeps_both_boxes():
    mix = compile_mixing([MixUp(p=0.5)])
    rs = np.concatenate(
        [mix.draw(0, 0, [i * 4 + k for k in range(4)], (8, 8), True).weights for i in range(500)]
    )
    mixed = rs[rs < 1]
    assert abs(len(mixed) / len(rs) - 0.5) < 0.05
    assert _ks(mixed, 32.0, 32.0) < 1.95 / math.sqrt(len(mixed))  # Ultralytics' r ~ Beta(32, 32)
    d = next(
        d for d in (mix.draw(0, 0, [i, i + 1, i + 2], (8, 8), True) for i in range(50)) if d.weights[0] < 1
    )
    targets = [
        {
            "boxes": torch.tensor([[float(j), 0, 4, 4]]),
            "classes": torch.tensor([j]),
            "iscrowd": torch.tensor([0]),
        }
        for j in range(3)
    ]
    masks = {"mask": torch.from_numpy(np.array([np.full((8, 8), j, np.uint8) for j in range(3)]))}
    masks["mask"][1, :4] = 0  # background in the top half of sample 1
    targets = _mixed(d, targets, masks)
    for j in range(3):
        expect = [j, (j - 1) % 3] if d.weights[j] < 1 else [j]
        assert targets[j]["classes"].tolist() == expect
        assert targets[j]["boxes"][:, 0].tolist() == [float(e) for e in expect]
    if d.weights[1] < 1:  # its own classes over its neighbour's
        assert (masks["mask"][1, :4] == 0).all() and (masks["mask"][1, 4:] == 1).all()


def test_cache_kinds_and_compile_rules():
    boxes = {"boxes": FieldSpec("boxes")}
    compile_mixing([MixUp()]).check_cache(boxes)
    compile_mixing([MixUp()]).check_cache({})
    for steps in ([CutMix()], [MixUp(), CutMix()], [MixUpOrCutMix()]):
        with pytest.raises(ValueError, match="classification cache"):
            compile_mixing(steps).check_cache(boxes)
    with pytest.raises(ValueError, match="classification cache"):
        compile_mixing([MixUp()]).check_cache({"mask": FieldSpec("mask")})
    with pytest.raises(ValueError, match="at most one"):
        compile_mixing([MixUp(), MixUp()])
    with pytest.raises(ValueError, match="at most one"):
        compile_mixing([MixUpOrCutMix(), CutMix()])
    with pytest.raises(ValueError, match="num_classes"):
        compile_mixing([MixUp(num_classes=10), CutMix(num_classes=5)])
    assert compile_mixing([]) is None


@pytest.mark.parametrize(
    "make",
    [lambda: MixUp(alpha=0), lambda: MixUp(alpha=-1), lambda: MixUp(alpha=float("nan")),
     lambda: MixUp(alpha=1e9), lambda: MixUp(p=2), lambda: MixUp(num_classes=0),
     lambda: CutMix(alpha=float("inf")), lambda: CutMix(num_classes=2.5), lambda: CutMix(p=-0.5),
     lambda: MixUpOrCutMix(0, 0), lambda: MixUpOrCutMix(switch_prob=1.5), lambda: MixUpOrCutMix(p=float("nan"))],
)  # fmt: skip
def test_hostile_arguments_are_one_line_errors(make):
    with pytest.raises(ValueError) as info:
        make()
    assert "\n" not in str(info.value)


def test_detection_mixup_leaves_a_batch_of_one_alone():
    """A batch of one (batch_size=1, or an epoch's last) rolls onto itself: a blend with itself kept
    every box twice (duplicate ground truth for the loss's assignment)."""
    mix = compile_mixing([MixUp(p=1.0)])
    for i in range(50):
        d = mix.draw(0, 0, [i], (8, 8), True)
        assert not d.mixes and (d.weights == 1).all()
        targets = [{"boxes": torch.tensor([[1.0, 1, 4, 4]]), "classes": torch.tensor([2])}]
        targets = _mixed(d, targets, {})
        assert targets[0]["classes"].tolist() == [2] and len(targets[0]["boxes"]) == 1
    assert (mix.draw(0, 0, [0, 1], (8, 8), True).weights < 1).all()  # two samples still mix


def test_detection_mixup_masks_keep_their_own_classes_over_the_neighbour_s_as_it_was():
    """Four samples whose class maps hold different non-zero classes in overlapping squares: a mixed
    sample keeps its own classes where it has any and takes its neighbour's (as stored, before the
    neighbour was itself mixed) where it has background; an unmixed one keeps its map."""
    mix = compile_mixing([MixUp(p=0.5)])

    def chained(d) -> bool:  # some mixed sample whose neighbour is mixed too, and one left as it is
        w = d.weights
        return (w == 1).any() and any(w[j] < 1 and w[j - 1] < 1 for j in range(4))

    d = next(
        d
        for d in (mix.draw(1, 0, [i, i + 1, i + 2, i + 3], (12, 12), True) for i in range(200))
        if chained(d)
    )
    stored = np.zeros((4, 12, 12), np.uint8)
    for j in range(4):
        stored[j, j : j + 6, j : j + 5] = 10 + j  # sample j's object, class 10 + j
    masks = {"mask": torch.from_numpy(stored.copy())}
    targets = [
        {"boxes": torch.tensor([[1.0 * j, 1.0 * j, j + 5.0, j + 6.0]]), "classes": torch.tensor([10 + j]),
         "iscrowd": torch.tensor([0])}
        for j in range(4)
    ]  # fmt: skip
    targets = _mixed(d, targets, masks)
    for j in range(4):
        own, other = stored[j], stored[j - 1]
        want = np.where(own != 0, own, other) if d.weights[j] < 1 else own
        assert np.array_equal(masks["mask"][j].numpy(), want), j
        overlap = (own != 0) & (other != 0)
        if d.weights[j] < 1:
            assert overlap.any() and (masks["mask"][j].numpy()[overlap] == 10 + j).all()
            assert targets[j]["classes"].tolist() == [10 + j, 10 + (j - 1) % 4]
        else:
            assert targets[j]["classes"].tolist() == [10 + j]
