"""What a loader's state keeps of its augmentation: the plan of the pass it names (the next pass's when it
is saved between passes), a warning only for a list that cannot be written, the user's ops asked for by
``set_augment``, and a schedule's refusal that names what it returned."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pytest

from cachekit import CachedDataset, make_loader
from cachekit.augment.draws import uniforms
from cachekit.augment.plan import AugmentUsageError
from cachekit.augment.protocol import Pixel
from cachekit.transforms import CenterCrop, PixelOp, RandomHorizontalFlip, RandomResizedCrop

A = [RandomResizedCrop(16), RandomHorizontalFlip()]
B = [CenterCrop(24)]


def _by_epoch(epoch):
    return A if epoch == 0 else B


def _darken(image, rng):
    return image // 2


def _invert(image, rng):
    return 255 - image


@dataclass(frozen=True)
class _Draws:
    chosen: np.ndarray

    def matrices(self, j: int) -> list:
        return []

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        if self.chosen[j]:
            np.subtract(255, chw, out=chw)


@dataclass(frozen=True)
class Invert(Pixel):
    """A transform of the user's own: not in the catalogue, so no spec text reads it back."""

    p: float = 0.5

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        return _Draws(uniforms(seed, epoch, idx, stream, 1)[:, 0] < self.p)


def _sizes(loader) -> set:
    return {tuple(x.shape[-2:]) for x, _ in loader}


def test_a_state_saved_before_a_pass_names_the_plan_that_pass_reads_with(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=1, augment=A)
    loader.set_augment(B)  # before the first pass: it reads with B
    assert loader.state_dict()["augment"].startswith("CenterCrop(size=24")
    assert _sizes(loader) == {(24, 24)}
    scheduled = make_loader(ds, 8, seed=1, augment=_by_epoch)
    for _ in scheduled:
        pass
    scheduled.set_epoch(1)
    state = scheduled.state_dict()  # before epoch 1 begins: epoch 1's plan
    assert (state["epoch"], state["position"]) == (1, 0) and state["augment"].startswith("CenterCrop(size=24")
    it = iter(scheduled)
    next(it)
    state = scheduled.state_dict()  # inside epoch 1
    del it
    assert state["position"] == 8 and state["augment"].startswith("CenterCrop(size=24")


def test_a_loader_without_augmentation_saves_and_resumes_without_a_warning(small_cache, caplog):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=1)
    it = iter(loader)
    next(it)
    with caplog.at_level(logging.WARNING, logger="cachekit"):
        state = loader.state_dict()
        del it
        scheduled = make_loader(ds, 8, seed=1, augment=lambda epoch: [Invert()])
        assert scheduled.state_dict()["augment"] is None  # asked again on resume: nothing to warn of
    assert state["augment"] == "" and "cannot be written" not in caplog.text
    resumed = make_loader(ds, 8, seed=1)
    resumed.load_state_dict(state)
    assert sum(len(x) for x, _ in resumed) == len(ds) - 8


def test_a_plan_that_cannot_be_written_warns_naming_its_epoch(small_cache, caplog):
    loader = make_loader(CachedDataset(small_cache), 8, seed=1, augment=[Invert()])
    loader.set_epoch(3)
    with caplog.at_level(logging.WARNING, logger="cachekit"):
        state = loader.state_dict()
    assert state["augment"] is None
    assert "state_dict: epoch 3's transforms cannot be written as text" in caplog.text


def test_user_ops_asked_for_by_set_augment_are_read_back_from_a_state(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=1, augment=[PixelOp(_darken)])
    it = iter(loader)
    next(it)
    loader.set_augment([PixelOp(_invert)])  # for the next epoch
    state = loader.state_dict()
    del it
    assert "_invert" in state["augment_next"]
    resumed = make_loader(ds, 8, seed=1, augment=[PixelOp(_darken)])
    resumed.set_augment([PixelOp(_invert)])  # the job asks again for what it asked before it stopped
    resumed.load_state_dict(state)
    rest = [x.clone() for x, _ in resumed]  # the rest of epoch 0, darkened
    assert max(int(x.max()) for x in rest) <= 127
    plain = make_loader(ds, 8, seed=1, augment=[PixelOp(_darken)])
    with pytest.raises(ValueError, match="_invert"):  # not given: the state's op cannot be found
        plain.load_state_dict(state)


@pytest.mark.parametrize(
    "returned, said",
    [(RandomHorizontalFlip, "the class RandomHorizontalFlip"), ({"p": 1}, "dict"), ("CenterCrop(8)", "str")],
)
def test_a_schedule_that_returns_no_list_is_refused_naming_what_it_returned(small_cache, returned, said):
    with pytest.raises(AugmentUsageError, match=rf"augment\(0\) returned {said}, not a list of transforms"):
        make_loader(CachedDataset(small_cache), 8, augment=lambda epoch: returned)


def test_a_state_saved_at_an_epochs_end_resumes_with_the_plan_asked_for_next(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=1, augment=A)
    for _ in loader:
        pass
    loader.set_augment(B)  # for epoch 1, asked after epoch 0 ended
    state = loader.state_dict()
    assert state["augment_next"] == "CenterCrop(size=24)"
    resumed = make_loader(ds, 8, seed=1, augment=A)
    resumed.load_state_dict(state)
    assert _sizes(resumed) == {(24, 24)} and _sizes(resumed) == {(24, 24)}  # epoch 1 and on: B


def test_a_function_asked_for_by_set_augment_gives_the_upcoming_plan_with_the_loader_s_min_visibility(
    small_cache,
):
    loader = make_loader(CachedDataset(small_cache), 8, seed=1, augment=A, min_visibility=0.6)
    loader.set_augment(_by_epoch)  # pending until the next pass begins
    upcoming = loader.augment_for(3)
    assert list(upcoming.listed) == B
    assert upcoming.min_visibility == 0.6
    assert list(loader.augment_for(0).listed) == A


def test_a_function_of_the_epoch_saved_mid_epoch_names_that_epoch_s_plan(small_cache):
    loader = make_loader(CachedDataset(small_cache), 8, seed=1, augment=_by_epoch)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    assert state["epoch"] == 0 and state["augment"].startswith("RandomResizedCrop(size=16")


def test_a_schedule_that_returns_no_list_is_told_what_to_return(small_cache):
    with pytest.raises(AugmentUsageError) as info:
        make_loader(CachedDataset(small_cache), 8, augment=lambda epoch: 3)
    assert str(info.value) == (
        "augment(0) returned int, not a list of transforms: a function of the epoch returns a list (or None: "
        "no augmentation that epoch)"
    )


def test_a_torchvision_transform_that_is_no_module_is_no_schedule():
    """torchvision's ``Compose`` (v1) is a plain callable, not an nn.Module: called with the epoch it
    would pass it through, so anything from torchvision is no function of the epoch."""
    from cachekit.feed.schedule import is_schedule_function

    class Compose:  # as torchvision.transforms.Compose: a callable class, no nn.Module
        def __call__(self, img):
            return img

    Compose.__module__ = "torchvision.transforms.transforms"
    assert not is_schedule_function(Compose())
    Compose.__module__ = "mytransforms"
    assert is_schedule_function(Compose())


def test_a_state_read_with_other_transforms_than_the_loader_s_own_ops_is_refused_naming_both(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=1, augment=B)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    mine = make_loader(ds, 8, seed=1, augment=[PixelOp(_darken)])
    with pytest.raises(AugmentUsageError) as info:
        mine.load_state_dict(state)
    said = str(info.value)
    assert said.startswith("augment: this loader was given PixelOp(") and "_darken" in said
    assert "read its epoch with CenterCrop(size=24)" in said and "\n" not in said


def test_a_function_of_the_epoch_is_asked_once_an_epoch_and_a_state_names_the_epoch_s_plan(small_cache):
    asked = []

    def by_parity(epoch):
        asked.append(epoch)
        return A if epoch % 2 == 0 else B

    loader = make_loader(CachedDataset(small_cache), 8, seed=1, augment=by_parity)
    assert loader.state_dict()["augment"].startswith("RandomResizedCrop(size=16")  # before epoch 0
    for _ in loader:
        pass
    state = loader.state_dict()  # at the end of epoch 0: its plan
    assert state["epoch"] == 0 and state["augment"].startswith("RandomResizedCrop(size=16")
    assert asked == [0]  # the loader's making, its pass and two states: one question
    assert _sizes(loader) == {(24, 24)} and asked == [0, 1]


def test_a_state_read_without_augmentation_is_refused_to_a_loader_given_its_own_ops(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(AugmentUsageError, match="the state it resumes read its epoch with no augmentation: "):
        make_loader(ds, 8, seed=1, augment=[PixelOp(_darken)]).load_state_dict(state)
