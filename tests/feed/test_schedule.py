"""Augmentation schedules: ``set_augment`` from the next epoch, ``augment`` as a function of the epoch,
on every read path (threads, the prefetch thread, worker processes, the device stage) and on resume."""

from __future__ import annotations

import pytest
import torch

from cachekit import CachedDataset, make_loader
from cachekit.augment.plan import compile_plan
from cachekit.errors import UsageError
from cachekit.feed.assemble import BatchRequest
from cachekit.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop

SEED = 5
A = [RandomResizedCrop(16), RandomHorizontalFlip()]  # 16 x 16: tells its batches apart
B = [CenterCrop(24)]  # 24 x 24


def _expected(ds, loader, epoch: int, steps, batch: int) -> list[torch.Tensor]:
    """The batches of ``epoch`` read straight from the dataset with ``steps``' plan."""
    order = loader.sampler.indices(epoch, 0).tolist()
    plan = compile_plan(steps)
    return [
        ds.read_request(BatchRequest(order[i : i + batch], epoch=epoch, seed=SEED, plan=plan)).images.clone()
        for i in range(0, len(order), batch)
    ]


def _same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert torch.equal(g, w)


def test_set_augment_takes_effect_at_the_next_epoch_not_in_the_batches_read_ahead(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=SEED, augment=A, prefetch_factor=4)
    assert "prefetch thread" in loader.mode
    it = iter(loader)
    epoch0 = [next(it)[0].clone() for _ in range(2)]  # the prefetch thread has read ahead by now
    loader.set_augment(B)  # mid-epoch: this pass keeps A to its last batch
    epoch0 += [images.clone() for images, _ in it]
    epoch1 = [images.clone() for images, _ in loader]
    epoch2 = [images.clone() for images, _ in loader]
    _same(epoch0, _expected(ds, loader, 0, A, 8))
    _same(epoch1, _expected(ds, loader, 1, B, 8))
    _same(epoch2, _expected(ds, loader, 2, B, 8))


def test_augment_as_a_function_of_the_epoch(small_cache):
    ds = CachedDataset(small_cache)
    asked = []

    def augment(epoch):
        asked.append(epoch)
        return A if epoch < 2 else B

    loader = make_loader(ds, 8, seed=SEED, augment=augment)
    for epoch in range(3):
        _same([x.clone() for x, _ in loader], _expected(ds, loader, epoch, augment(epoch), 8))
    assert set(asked) == {0, 1, 2}
    loader.set_epoch(0)  # an epoch run again reads with its own plan again
    _same([x.clone() for x, _ in loader], _expected(ds, loader, 0, A, 8))


def test_none_turns_augmentation_off_and_on(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=SEED, augment=lambda e: None if e % 2 else A)
    sizes = [{tuple(x.shape[-2:]) for x, _ in loader} for _ in range(3)]
    assert sizes == [{(16, 16)}, {(32, 32)}, {(16, 16)}]


def test_worker_processes_read_each_epoch_with_its_plan(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=SEED, augment=A, workers=2)
    assert loader.num_workers == 2 and loader.persistent_workers
    epoch0 = [x.clone() for x, _ in loader]
    loader.set_augment(lambda epoch: B if epoch >= 2 else A)
    epoch1 = [x.clone() for x, _ in loader]
    epoch2 = [x.clone() for x, _ in loader]
    _same(epoch0, _expected(ds, loader, 0, A, 8))
    _same(epoch1, _expected(ds, loader, 1, A, 8))
    _same(epoch2, _expected(ds, loader, 2, B, 8))


def test_the_device_stage_follows_the_schedule(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=SEED, augment=A, device="cpu", augment_on="device")
    assert "augment on cpu" in loader.mode
    first = [x for x, _ in loader]
    loader.set_augment(B)
    second = [x for x, _ in loader]
    for got, want in zip(first + second, _expected(ds, loader, 0, A, 8) + _expected(ds, loader, 1, B, 8)):
        assert got.shape == want.shape  # the device's batched kernel: within a grey level of the threads'
        assert (got.float() - want.float()).abs().mean() < 1.0


def test_resume_mid_epoch_reads_the_rest_with_that_epochs_plan(small_cache):
    ds = CachedDataset(small_cache)
    whole = make_loader(ds, 8, seed=SEED, augment=A)
    for _ in whole:
        pass
    whole.set_augment(B)
    full = [x.clone() for x, _ in whole]  # epoch 1, with B

    loader = make_loader(ds, 8, seed=SEED, augment=A)
    for _ in loader:
        pass
    loader.set_augment(B)
    it = iter(loader)
    head = [next(it)[0].clone() for _ in range(2)]
    state = loader.state_dict()
    del it
    assert state["epoch"] == 1 and state["position"] == 16
    assert state["augment"].startswith("CenterCrop(size=24)")

    resumed = make_loader(ds, 8, seed=SEED, augment=A)  # built as at the start of the job
    resumed.load_state_dict(state)
    rest = [x.clone() for x, _ in resumed]
    _same(head + rest, full)
    assert {tuple(x.shape[-2:]) for x, _ in resumed} == {(24, 24)}  # and B goes on after it


def test_a_plan_asked_for_after_the_saved_epoch_is_resumed_too(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=SEED, augment=A)
    it = iter(loader)
    next(it)
    loader.set_augment(B)  # for epoch 1, asked during epoch 0
    state = loader.state_dict()
    del it
    assert state["augment"].startswith("RandomResizedCrop(size=16") and state["augment_next"].startswith(
        "CenterCrop"
    )
    resumed = make_loader(ds, 8, seed=SEED, augment=[CenterCrop(8)])
    resumed.load_state_dict(state)
    assert {tuple(x.shape[-2:]) for x, _ in resumed} == {(16, 16)}  # the rest of epoch 0: A
    assert {tuple(x.shape[-2:]) for x, _ in resumed} == {(24, 24)}  # epoch 1: B


def test_a_function_of_the_epoch_resumes_by_asking_it_again(small_cache):
    ds = CachedDataset(small_cache)

    def augment(epoch):
        return A if epoch == 0 else B

    loader = make_loader(ds, 8, seed=SEED, augment=augment)
    for _ in loader:
        pass
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    resumed = make_loader(ds, 8, seed=SEED, augment=augment)
    resumed.load_state_dict(state)
    assert state["epoch"] == 1 and {tuple(x.shape[-2:]) for x, _ in resumed} == {(24, 24)}


def test_bad_schedules_fail_in_one_line_before_reading(small_cache, tmp_path):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, seed=SEED, augment=A)
    with pytest.raises(UsageError, match=r"the function .*<lambda> in the augment list: wrap it as PixelOp\(fn\)"):
        loader.set_augment([lambda x: x])
    with pytest.raises(ValueError, match="size must be a positive int"):
        loader.set_augment([CenterCrop(24), RandomResizedCrop(0)])
    assert {tuple(x.shape[-2:]) for x, _ in loader} == {(16, 16)}  # refused lists changed nothing
    big = make_loader(ds, 512, seed=SEED, augment=A)
    with pytest.raises(ValueError, match="over the limit"):  # 512 x 3 x 8192 x 8192 bytes
        big.set_augment([RandomResizedCrop(8192)])

    def broken(epoch):
        if epoch == 1:
            raise ValueError("no plan for this epoch")
        return A

    loader = make_loader(ds, 8, seed=SEED, augment=broken)
    for _ in loader:
        pass
    with pytest.raises(ValueError, match=r"augment\(1\) failed: no plan for this epoch"):
        next(iter(loader))
    with pytest.raises(UsageError, match=r"augment\(0\) returned a list .*the text 'RandomResizedCrop\(16\)'"):
        make_loader(ds, 8, augment=lambda epoch: ["RandomResizedCrop(16)"])  # epoch 0's is checked at once
    with pytest.raises(UsageError, match="wrap it as PixelOp"):
        make_loader(ds, 8, augment=[lambda x: x])


def test_a_state_whose_augment_is_not_text_is_refused_not_ignored(small_cache):
    # a number or list there was silently passed over: the rest of the epoch read with other transforms
    loader = make_loader(CachedDataset(small_cache), 8, seed=SEED, augment=A)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    for bad in (5, ["CenterCrop(24)"], {"a": 1}):
        resumed = make_loader(CachedDataset(small_cache), 8, seed=SEED, augment=A)
        with pytest.raises(ValueError, match="not a list of transforms as text") as info:
            resumed.load_state_dict({**state, "augment": bad})
        assert "\n" not in str(info.value)
        assert resumed.state_dict()["position"] == 0  # nothing of the refused state taken
    resumed = make_loader(CachedDataset(small_cache), 8, seed=SEED, augment=A)
    resumed.load_state_dict({**state, "augment": None})  # not written: the loader's own list
