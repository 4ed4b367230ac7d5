"""RandAugment, TrivialAugmentWide and AutoAugment draws against torchvision's definitions: which ops,
how often, at which magnitudes, signs half the time; the same draws whatever the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cachekit.augment.autoaugment import POLICY_TABLES, draw_ops
from cachekit.transforms import AutoAugment, RandAugment, TrivialAugmentWide

N = 20_000
H, W = 60, 90

#: torchvision v2's tables for RandAugment (left) and TrivialAugmentWide (right), written out again here
#: from its source as the reference: op -> (magnitudes(bins, h, w), signed).
TV_RAND = {
    "Identity": (None, False),
    "ShearX": (lambda b, h, w: torch.linspace(0.0, 0.3, b), True),
    "ShearY": (lambda b, h, w: torch.linspace(0.0, 0.3, b), True),
    "TranslateX": (lambda b, h, w: torch.linspace(0.0, 150.0 / 331.0 * w, b), True),
    "TranslateY": (lambda b, h, w: torch.linspace(0.0, 150.0 / 331.0 * h, b), True),
    "Rotate": (lambda b, h, w: torch.linspace(0.0, 30.0, b), True),
    "Brightness": (lambda b, h, w: torch.linspace(0.0, 0.9, b), True),
    "Color": (lambda b, h, w: torch.linspace(0.0, 0.9, b), True),
    "Contrast": (lambda b, h, w: torch.linspace(0.0, 0.9, b), True),
    "Sharpness": (lambda b, h, w: torch.linspace(0.0, 0.9, b), True),
    "Posterize": (lambda b, h, w: (8 - (torch.arange(b) / ((b - 1) / 4))).round().int(), False),
    "Solarize": (lambda b, h, w: torch.linspace(1.0, 0.0, b), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}
TV_WIDE = {
    **TV_RAND,
    "ShearX": (lambda b, h, w: torch.linspace(0.0, 0.99, b), True),
    "ShearY": (lambda b, h, w: torch.linspace(0.0, 0.99, b), True),
    "TranslateX": (lambda b, h, w: torch.linspace(0.0, 32.0, b), True),
    "TranslateY": (lambda b, h, w: torch.linspace(0.0, 32.0, b), True),
    "Rotate": (lambda b, h, w: torch.linspace(0.0, 135.0, b), True),
    "Brightness": (lambda b, h, w: torch.linspace(0.0, 0.99, b), True),
    "Color": (lambda b, h, w: torch.linspace(0.0, 0.99, b), True),
    "Contrast": (lambda b, h, w: torch.linspace(0.0, 0.99, b), True),
    "Sharpness": (lambda b, h, w: torch.linspace(0.0, 0.99, b), True),
    "Posterize": (lambda b, h, w: (8 - (torch.arange(b) / ((b - 1) / 6))).round().int(), False),
}


def _within(count: float, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * np.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("num_ops,magnitude,bins", [(2, 9, 31), (3, 14, 31), (1, 4, 10)])
def test_randaugment_ops_uniform_magnitudes_and_signs_as_torchvision(num_ops, magnitude, bins):
    d = draw_ops(RandAugment(num_ops, magnitude, bins), 1, 0, np.arange(N), 2001, (H, W))
    assert d.names == tuple(TV_RAND) and d.ops.shape == (N, num_ops)
    for op, name in enumerate(d.names):
        here = d.ops == op
        assert _within(here.sum(), N * num_ops, 1 / len(TV_RAND)), name
        fn, signed = TV_RAND[name]
        values = np.abs(d.magnitudes[here])
        if fn is None:
            assert (values == 0).all()
            continue
        want = float(fn(bins, H, W)[magnitude])
        assert np.allclose(values, abs(want), rtol=1e-6, atol=1e-6), name
        negative = (d.magnitudes[here] < 0).sum()
        if signed and want != 0:
            assert _within(negative, here.sum(), 0.5), name
        else:
            assert negative == 0


def test_trivialaugment_bins_uniform_and_values_from_the_wide_table():
    bins = 31
    d = draw_ops(TrivialAugmentWide(bins), 2, 3, np.arange(N), 2002, (H, W))
    assert d.names == tuple(TV_WIDE) and d.ops.shape == (N, 1)
    for op, name in enumerate(d.names):
        here = d.ops[:, 0] == op
        assert _within(here.sum(), N, 1 / len(TV_WIDE)), name
    rotate = np.abs(d.magnitudes[d.ops[:, 0] == d.names.index("Rotate"), 0])
    table = TV_WIDE["Rotate"][0](bins, H, W).numpy()
    found = np.array([np.argmin(np.abs(table - v)) for v in rotate])
    assert np.allclose(table[found], rotate, atol=1e-4)  # every value is one of the table's
    counts = np.bincount(found, minlength=bins)
    assert all(_within(c, len(rotate), 1 / bins) for c in counts)
    posterize = d.magnitudes[d.ops[:, 0] == d.names.index("Posterize"), 0]
    assert set(np.unique(posterize).astype(int)) <= set(TV_WIDE["Posterize"][0](bins, H, W).tolist())


def test_autoaugment_policies_as_torchvision_lists_them():
    # spot checks against torchvision's tables (first and last sub-policies)
    assert POLICY_TABLES["imagenet"][0] == (("Posterize", 0.4, 8), ("Rotate", 0.6, 9))
    assert POLICY_TABLES["imagenet"][-1] == (("Equalize", 0.8, None), ("Equalize", 0.6, None))
    assert POLICY_TABLES["cifar10"][1] == (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9))
    assert POLICY_TABLES["svhn"][-1] == (("ShearX", 0.7, 2), ("Invert", 0.1, None))
    assert all(len(t) == 25 for t in POLICY_TABLES.values())
    for policy in ("imagenet", "svhn"):
        d = draw_ops(AutoAugment(policy), 0, 0, np.arange(N), 2003, (H, W))
        table = POLICY_TABLES[policy]
        for op, name in enumerate(d.names):
            for slot in range(2):
                want = sum(sub[slot][1] for sub in table if sub[slot][0] == name) / len(table)
                assert _within((d.ops[:, slot] == op).sum(), N, want), (policy, name, slot)
        rotate = d.magnitudes[d.ops == d.names.index("Rotate")]
        assert set(np.round(np.abs(rotate), 4)) <= {round(30.0 * k / 9, 4) for k in range(10)}


def test_draws_depend_on_seed_epoch_and_index_only():
    step = RandAugment()
    idx = np.array([4, 17, 900, 5])
    a = draw_ops(step, 3, 1, idx, 2001, (H, W))
    alone = draw_ops(step, 3, 1, idx[2:3], 2001, (H, W))
    assert np.array_equal(a.ops[2], alone.ops[0]) and np.array_equal(a.magnitudes[2], alone.magnitudes[0])
    many = draw_ops(step, 3, 1, np.arange(200), 2001, (H, W))
    other = draw_ops(step, 3, 2, np.arange(200), 2001, (H, W))
    assert not np.array_equal(many.ops, other.ops)


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandAugment(num_ops=-1),
        lambda: RandAugment(num_ops=10**6),
        lambda: RandAugment(magnitude=31),
        lambda: RandAugment(magnitude=-1),
        lambda: RandAugment(magnitude=float("nan")),
        lambda: RandAugment(num_magnitude_bins=1),
        lambda: RandAugment(num_magnitude_bins=10**9),
        lambda: RandAugment(fill=300),
        lambda: RandAugment(fill=(1, 2, float("nan"))),
        lambda: RandAugment(fill=(1, 2)),
        lambda: TrivialAugmentWide(num_magnitude_bins=0),
        lambda: TrivialAugmentWide(fill=-1),
        lambda: AutoAugment("imagenet2"),
        lambda: AutoAugment(policy=3),
    ],
)
def test_hostile_arguments_are_one_line_errors(make):
    with pytest.raises(ValueError) as info:
        make()
    assert "\n" not in str(info.value)
