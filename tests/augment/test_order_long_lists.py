"""The order check of an augment list costs its length, not its square: a list of many thousand steps
is taken (or refused) at once, with what the pairwise rule says, step by step, for every short list.

The rule: a step listed before one the plan runs ahead of it is refused, unless the two commute (a
per-pixel step before a mirror). The check is counted, not timed: the pairwise test of two steps is
asked at most once a step.
"""

from __future__ import annotations

import itertools

import pytest

from cachekit import make_loader
from cachekit.augment import plan
from cachekit.augment.plan import check_order
from cachekit.errors import UsageError
from cachekit.transforms import (
    CenterCrop,
    ColorJitter,
    GaussianBlur,
    MixUp,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomHSV,
    RandomVerticalFlip,
    Resize,
)


def _pairwise(steps) -> str | None:
    """What the rule says of ``steps``, one pair of steps at a time: the refusal's text, or None."""
    stages = [plan._stage_of(s) for s in steps]
    name = [type(s).__name__ for s in steps]
    for i, step in enumerate(steps):
        ahead = [
            k for k in range(i + 1, len(steps)) if stages[k] < stages[i] and not plan._commute(step, steps[k])
        ]
        if not ahead:
            continue
        if stages[i] == plan._BATCH:
            return f"{name[i]} mixes whole batches, after every per-sample step has run: list it after {name[ahead[-1]]} (at the end)"
        geometry = [k for k in ahead if stages[k] == plan._GEOMETRY]
        if not geometry:
            return f"{name[ahead[0]]} runs right after the geometry, before the per-sample pixel transforms: list it before {name[i]}"
        return f"{name[i]} runs on each sample after its geometry (crops, resizes, flips, warps): list it after {name[geometry[-1]]}"
    return None


#: A step of every stage, per-pixel or not, mirror or not.
POOL = (
    RandomHorizontalFlip(),
    RandomVerticalFlip(),
    CenterCrop(16),
    Resize((16, 16)),
    ColorJitter(0.4),
    RandomGrayscale(),
    RandomHSV(),
    GaussianBlur(3),
    MixUp(),
)


def _said(steps) -> str | None:
    try:
        check_order(steps)
    except UsageError as exc:
        return str(exc)
    return None


def test_every_short_list_is_judged_as_the_pairwise_rule_judges_it():
    judged = refused = 0
    for n in range(1, 5):
        for steps in itertools.product(POOL, repeat=n):
            want, got = _pairwise(steps), _said(steps)
            if want is None:
                assert got is None, (steps, got)
            else:
                assert got is not None and got == f"augment: {want}", (steps, got, want)
                refused += 1
            judged += 1
    assert judged == sum(len(POOL) ** n for n in range(1, 5)) and 0 < refused < judged


@pytest.fixture
def pair_tests(monkeypatch):
    """How many times the pairwise test of two steps (``plan._commute``) is asked."""
    asked = [0]
    commute = plan._commute

    def counted(earlier, later):
        asked[0] += 1
        return commute(earlier, later)

    monkeypatch.setattr(plan, "_commute", counted)
    return asked


@pytest.mark.parametrize("n", [500, 1000])
def test_a_long_list_is_taken_with_work_in_proportion_to_its_length(small_cache, pair_tests, n):
    """Per-pixel steps before mirrors commute with each: the list is taken, without asking of every pair."""
    steps = [CenterCrop(16)] + [RandomGrayscale(p=0.5)] * n + [RandomHorizontalFlip(p=0.5)] * n
    loader = make_loader(small_cache, 4, augment=steps)
    assert len(loader.augment_for(0).listed) == 2 * n + 1
    assert pair_tests[0] <= len(steps)


@pytest.mark.parametrize("n", [500, 1000])
def test_a_long_list_out_of_order_at_its_end_is_refused_with_the_fix_and_work_in_proportion(pair_tests, n):
    steps = [RandomGrayscale()] * n + [RandomHorizontalFlip()] * n + [MixUp(), GaussianBlur(3)]
    assert _said(steps) == (
        "augment: MixUp mixes whole batches, after every per-sample step has run: list it after GaussianBlur "
        "(at the end)"
    )
    assert pair_tests[0] <= len(steps)
