"""MixUp and CutMix: batch-level transforms after the per-sample stage, each batch mixed with its roll by one.

On a classification cache they are torchvision v2's: one ``lam ~ Beta(alpha, alpha)`` per batch,
the images mixed with ``images.roll(1, 0)`` (MixUp blends them, CutMix pastes a box of area
``1 - lam`` at a uniform centre, clipped, ``lam`` then corrected to the area kept), and labels
become soft: ``float [B, num_classes]``, ``lam * one_hot(y) + (1 - lam) * one_hot(y.roll(1))``.
On a detection cache (boxes) MixUp is Ultralytics': each sample, with probability ``p``, is
blended with its neighbour in the batch by ``r ~ Beta(32, 32)`` and keeps both samples' boxes
(class maps: its own classes over the neighbour's). A batch's draws come from (seed, epoch, the
batch's first index), so they reproduce whatever the thread or worker count.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from ..image.instances import Instances
from .checks import check_p
from .draws import keyed_generator
from .protocol import Batch

__all__ = ["MixUp", "CutMix", "MixUpOrCutMix", "BATCH_TRANSFORMS", "BatchMix", "MixDraws", "compile_mixing"]

#: The largest ``num_classes`` soft labels are made for (a [B, K] float32 tensor per batch: 100 MB at B=256).
MAX_CLASSES = 100_000
#: Ultralytics' MixUp ratio: ``r ~ Beta(32, 32)``.
DETECTION_ALPHA = 32.0
#: Streams of the batch stage start here.
STREAM = 3000


def _alpha(value, name: str, zero: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or not (0.0 <= float(value) if zero else 0.0 < float(value)) or float(value) > 1000.0:
        low = ">= 0 (0 turns it off)" if zero else "> 0"
        raise ValueError(f"{name} must be a number {low} and at most 1000, got {value!r}")
    return float(value)


def _classes(value, name: str) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_CLASSES
    ):
        raise ValueError(
            f"{name}: num_classes must be an integer 1-{MAX_CLASSES} or None (the cache's), got {value!r}"
        )


@dataclass(frozen=True)
class MixUp(Batch):
    """Blend each batch with its roll by one; ``alpha`` None is 1.0 on classification caches
    (torchvision's default) and 32.0 on detection caches (Ultralytics'); ``p``: the chance a batch
    (a sample, on detection caches) is mixed."""

    alpha: float | None = None
    num_classes: int | None = None
    p: float = 1.0

    def __post_init__(self) -> None:
        if self.alpha is not None:
            _alpha(self.alpha, "MixUp: alpha")
        _classes(self.num_classes, "MixUp")
        check_p(self.p, "MixUp")


@dataclass(frozen=True)
class CutMix(Batch):
    """Paste a box of each batch's roll by one (classification caches only)."""

    alpha: float = 1.0
    num_classes: int | None = None
    p: float = 1.0

    def __post_init__(self) -> None:
        _alpha(self.alpha, "CutMix: alpha")
        _classes(self.num_classes, "CutMix")
        check_p(self.p, "CutMix")


@dataclass(frozen=True)
class MixUpOrCutMix(Batch):
    """timm's / DeiT's choice per batch: with probability ``p`` a batch is mixed, by CutMix with
    probability ``switch_prob`` and by MixUp otherwise (an alpha of 0 turns that one off).
    ``[MixUp(), CutMix()]`` in a list means the same with ``switch_prob=0.5``, as torchvision's
    ``RandomChoice([MixUp(), CutMix()])``."""

    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    switch_prob: float = 0.5
    p: float = 1.0
    num_classes: int | None = None

    def __post_init__(self) -> None:
        a = _alpha(self.mixup_alpha, "MixUpOrCutMix: mixup_alpha", zero=True)
        b = _alpha(self.cutmix_alpha, "MixUpOrCutMix: cutmix_alpha", zero=True)
        if a == 0 and b == 0:
            raise ValueError("MixUpOrCutMix: mixup_alpha and cutmix_alpha are both 0: give one of them > 0")
        check_p(self.switch_prob, "MixUpOrCutMix switch_prob")
        check_p(self.p, "MixUpOrCutMix")
        _classes(self.num_classes, "MixUpOrCutMix")


BATCH_TRANSFORMS = (MixUp, CutMix, MixUpOrCutMix)


@dataclass(frozen=True)
class MixDraws:
    """One batch's mixing: ``kind`` "mixup", "cutmix", "detection" or "none"; ``lam`` the weight of each
    sample's own label; ``box`` (y1, y2, x1, x2) CutMix's; ``weights [B]`` each sample's own share on a
    detection cache (1: not mixed)."""

    kind: str
    lam: float = 1.0
    box: tuple[int, int, int, int] = (0, 0, 0, 0)
    weights: np.ndarray | None = None

    @property
    def mixes(self) -> bool:
        return self.kind != "none" and (self.weights is None or bool((self.weights < 1).any()))

    def mix_row(self, src: np.ndarray, dst: np.ndarray, j: int) -> None:
        """Row ``j`` of the mixed batch ``dst`` from ``src`` uint8 ``[B, C, H, W]`` (its neighbour ``j - 1``)."""
        partner = (j - 1) % len(src)
        own = self.weights[j] if self.weights is not None else self.lam
        if self.kind == "cutmix":
            y1, y2, x1, x2 = self.box
            dst[j] = src[j]
            dst[j, :, y1:y2, x1:x2] = src[partner, :, y1:y2, x1:x2]
        elif own >= 1.0:
            dst[j] = src[j]
        else:
            a, b = src[j].reshape(-1, src.shape[-1]), src[partner].reshape(-1, src.shape[-1])
            cv2.addWeighted(a, float(own), b, 1.0 - float(own), 0.0, dst=dst[j].reshape(-1, src.shape[-1]))

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        """The same on a float batch (any device)."""
        if not self.mixes:
            return x
        rolled = x.roll(1, 0)
        if self.kind == "cutmix":
            y1, y2, x1, x2 = self.box
            out = x.clone()
            out[:, :, y1:y2, x1:x2] = rolled[:, :, y1:y2, x1:x2]
            return out
        own = (
            torch.from_numpy(self.weights.astype(np.float32)).to(x.device).view(-1, 1, 1, 1)
            if self.weights is not None
            else torch.tensor(self.lam, dtype=torch.float32, device=x.device)
        )
        return x * own + rolled * (1.0 - own)

    def soft_labels(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """``float32 [B, num_classes]``: one-hot labels mixed with their roll by ``lam``."""
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(
                f"MixUp/CutMix: a label ({int(labels.max())}) is outside num_classes={num_classes}: "
                "leave num_classes None (the cache's) or give the model's"
            )
        one = np.zeros((len(labels), num_classes), dtype=np.float32)
        one[np.arange(len(labels)), labels] = 1.0
        if self.kind in ("none", "detection"):
            return one
        return (self.lam * one + (1.0 - self.lam) * np.roll(one, 1, axis=0)).astype(np.float32)

    def mix_objects(self, objects: Instances, n: int) -> Instances:
        """Detection: each mixed sample keeps its objects and gains its neighbour's (``j - 1``), as they
        were before mixing; ``objects`` sorted by sample, as the result is."""
        if self.weights is None or not n:
            return objects
        spans = objects.spans(n)
        take, owner = [], []
        for j, (a, b) in enumerate(spans):
            mine = list(range(a, b))
            if self.weights[j] < 1:
                pa, pb = spans[(j - 1) % n]
                mine += range(pa, pb)
            take += mine
            owner += [j] * len(mine)
        mixed = objects.select(np.asarray(take, dtype=np.int64))
        return dataclasses.replace(mixed, owner=np.asarray(owner, dtype=np.int64))

    def mix_masks(self, masks: dict[str, torch.Tensor]) -> None:
        """Detection: a mixed sample's class map keeps its own classes over its neighbour's. In place."""
        if self.weights is None:
            return
        for buffer in masks.values():
            n = len(buffer)
            saved = buffer.clone()
            for j in np.flatnonzero(self.weights < 1).tolist():
                own, other = saved[j], saved[(j - 1) % n]
                buffer[j] = torch.where(own != 0, own, other)


@dataclass(frozen=True)
class BatchMix:
    """The compiled batch stage: MixUp's and CutMix's alphas (None: absent; MixUp's ``auto``: by the
    cache's kind), the chance of CutMix when both are there, each one's ``p``, ``num_classes``."""

    mixup_alpha: float | None
    cutmix_alpha: float | None
    switch_prob: float
    mixup_p: float
    cutmix_p: float
    num_classes: int | None
    mixup_auto: bool = False

    def draw(self, seed: int, epoch: int, indices, out_hw: tuple[int, int], detection: bool) -> MixDraws:
        """The batch's mixing, from (seed, epoch, its first index)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(idx)
        if n == 0:
            return MixDraws("none")
        rng = keyed_generator(seed, epoch, int(idx[0]), STREAM)
        mixup_alpha = self.mixup_alpha
        if self.mixup_auto:
            mixup_alpha = DETECTION_ALPHA if detection else 1.0
        if detection:
            chosen = rng.random(n) < self.mixup_p
            r = rng.beta(mixup_alpha, mixup_alpha, size=n)
            if n == 1:  # its only neighbour is itself: a blend with itself would keep every box twice
                return MixDraws("detection", weights=np.ones(1))
            return MixDraws("detection", weights=np.where(chosen, r, 1.0))
        cut = self.cutmix_alpha is not None and (mixup_alpha is None or rng.random() < self.switch_prob)
        applied = rng.random() < (self.cutmix_p if cut else self.mixup_p)
        alpha = self.cutmix_alpha if cut else mixup_alpha
        lam = float(rng.beta(alpha, alpha))
        if not applied:
            return MixDraws("none")
        if not cut:
            return MixDraws("mixup", lam=lam)
        h, w = out_hw
        cx, cy = int(rng.integers(w)), int(rng.integers(h))
        r = 0.5 * math.sqrt(1.0 - lam)
        half_w, half_h = int(r * w), int(r * h)
        x1, y1 = max(cx - half_w, 0), max(cy - half_h, 0)
        x2, y2 = min(cx + half_w, w), min(cy + half_h, h)
        kept = 1.0 - (x2 - x1) * (y2 - y1) / (w * h)
        return MixDraws("cutmix", lam=float(kept), box=(y1, y2, x1, x2))

    def check_cache(self, fields: dict, classes: int | None = None) -> None:
        """One line when this stage cannot run on a cache with these ``fields`` (``FieldSpec`` by name)
        and ``classes`` class names: soft labels narrower than its classes fail at the first label past them."""
        kinds = {spec.kind for spec in fields.values()}
        if not kinds and classes and self.num_classes is not None and self.num_classes < classes:
            raise ValueError(
                f"MixUp/CutMix: num_classes={self.num_classes} is fewer than this cache's {classes} classes: "
                "leave it None (the cache's) or give the model's"
            )
        if "boxes" in kinds:
            if self.cutmix_alpha is not None:
                raise ValueError(
                    "CutMix needs a classification cache: on a detection cache (boxes) use MixUp(), "
                    "Ultralytics' (both images blended, both samples' boxes kept)"
                )
            return
        if kinds:
            raise ValueError(
                f"MixUp and CutMix need a classification cache (one class per sample) or a detection cache "
                f"(boxes); this cache's targets are {', '.join(sorted(kinds))}"
            )


def compile_mixing(steps) -> BatchMix | None:
    """The batch stage of an augment list: a MixUp, a CutMix, both (one chosen per batch, even odds), or
    one MixUpOrCutMix; None when there is none."""
    found = [s for s in steps if isinstance(s, BATCH_TRANSFORMS)]
    if not found:
        return None
    kinds = [type(s) for s in found]
    if len(found) != len(set(kinds)) or (MixUpOrCutMix in kinds and len(found) > 1):
        raise ValueError(
            "augment: give at most one MixUp and one CutMix (one is chosen per batch), or one MixUpOrCutMix"
        )
    classes = {s.num_classes for s in found if s.num_classes is not None}
    if len(classes) > 1:
        raise ValueError(f"augment: MixUp and CutMix were given different num_classes ({sorted(classes)})")
    num_classes = classes.pop() if classes else None
    if isinstance(found[0], MixUpOrCutMix):
        s = found[0]
        a = s.mixup_alpha or None
        b = s.cutmix_alpha or None
        switch = s.switch_prob if a and b else (1.0 if b else 0.0)
        return BatchMix(a, b, switch, s.p, s.p, num_classes)
    mixup = next((s for s in found if isinstance(s, MixUp)), None)
    cutmix = next((s for s in found if isinstance(s, CutMix)), None)
    return BatchMix(
        mixup_alpha=None if mixup is None else mixup.alpha,
        cutmix_alpha=None if cutmix is None else cutmix.alpha,
        switch_prob=0.5 if mixup and cutmix else (1.0 if cutmix else 0.0),
        mixup_p=mixup.p if mixup else 0.0,
        cutmix_p=cutmix.p if cutmix else 0.0,
        num_classes=num_classes,
        mixup_auto=mixup is not None and mixup.alpha is None,
    )
