"""make_loader, suggest_num_workers (with fake cgroup files) and the DDP example under torchrun."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from cachekit import CachedDataset, make_loader, suggest_num_workers


def test_pixel_cache_reads_in_process_with_a_prefetch_thread(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, batch_size=8)
    assert isinstance(loader, DataLoader) and loader.num_workers == 0
    assert "prefetch thread" in loader.mode and loader.pin_memory == torch.cuda.is_available()
    seen = []
    reference = ds.read_batch(list(range(len(ds))))[0]
    for images, labels in loader:
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        seen += [next(i for i in range(len(ds)) if torch.equal(reference[i], img)) for img in images]
    assert sorted(seen) == list(range(len(ds)))


def test_transforms_get_worker_processes(small_cache):
    ds = CachedDataset(small_cache, transform=lambda x: x)
    loader = make_loader(ds, batch_size=8, shuffle=False)
    assert loader.num_workers == suggest_num_workers(8) and loader.num_workers > 0
    assert loader.persistent_workers and "worker processes" in loader.mode
    assert sum(len(b[0]) for b in loader) == len(ds)


def test_device_conversion_normalises_with_the_cache_stats(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, batch_size=40, shuffle=False, device="cpu", normalize=True)
    images, _ = next(iter(loader))
    assert images.dtype == torch.float32
    mean = torch.tensor(ds.manifest.mean).view(1, 3, 1, 1)
    std = torch.tensor(ds.manifest.std).view(1, 3, 1, 1)
    raw = ds.read_batch(range(40))[0].float() / 255
    torch.testing.assert_close(images, (raw - mean) / std)
    assert images.mean(dim=(0, 2, 3)).abs().max() < 1e-3  # the whole cache: zero mean per channel


def test_loader_state_resumes_from_delivered_batches(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, batch_size=4, seed=2)
    batches = iter(loader)
    first = [next(batches)[1] for _ in range(3)]  # the prefetch thread has read further than this
    state = loader.state_dict()
    assert state["position"] == 12 and state["epoch"] == 0
    full = torch.cat([y for _, y in make_loader(ds, batch_size=4, seed=2)]).tolist()
    again = make_loader(ds, batch_size=4, seed=2)
    again.load_state_dict(state)
    rest = torch.cat([y for _, y in again]).tolist()
    assert torch.cat(first).tolist() + rest == full


def test_each_pass_over_the_loader_is_a_new_epoch(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, batch_size=8, seed=1)
    orders = [torch.cat([y for _, y in loader]).tolist() for _ in range(3)]
    images = [torch.cat([x for x, _ in loader]) for _ in range(1)]
    assert len({tuple(o) for o in orders}) == 3 and loader.sampler.epoch == 3 and images
    for epoch in (0, 2):
        loader.set_epoch(epoch)
        assert torch.cat([y for _, y in loader]).tolist() == orders[epoch]


def test_prefetch_thread_propagates_errors(small_cache):
    ds = CachedDataset(small_cache, transform=lambda x: 1 / 0)
    loader = make_loader(ds, batch_size=4, workers=0)
    with pytest.raises(ZeroDivisionError):
        next(iter(loader))


# -- augmentation through make_loader -------------------------------------------------------------


def _epoch(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*[(x, y) for x, y, *_ in loader])
    return torch.cat(images), torch.cat(labels)


def test_augment_is_reproducible_new_each_epoch_and_independent_of_threads(small_cache):
    from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

    ds = CachedDataset(small_cache)
    augment = [RandomResizedCrop(24), RandomHorizontalFlip()]
    one = make_loader(ds, batch_size=8, seed=3, augment=augment, threads=1)
    two = make_loader(ds, batch_size=8, seed=3, augment=augment, threads=2)
    assert "augment on CPU threads" in two.mode and "2 threads" in two.mode
    a0, y0 = _epoch(one)
    b0, z0 = _epoch(two)
    assert a0.shape == (40, 3, 24, 24) and a0.dtype == torch.uint8
    assert torch.equal(a0, b0) and torch.equal(y0, z0)  # same draws whatever the thread count
    a1, y1 = _epoch(one)  # the next pass: another order and other crops
    assert not torch.equal(y0, y1)
    one.set_epoch(0)
    again, _ = _epoch(one)
    assert torch.equal(again, a0)
    forked = make_loader(ds, batch_size=8, seed=3, augment=augment, workers=2)  # worker processes
    assert forked.num_workers == 2
    c0, w0 = _epoch(forked)
    assert torch.equal(c0, a0) and torch.equal(w0, y0)


def test_device_path_on_cpu_matches_the_threads_path(small_cache):
    from cachekit.transforms import ColorJitter, RandomHorizontalFlip, RandomResizedCrop

    ds = CachedDataset(small_cache)
    augment = [RandomResizedCrop(24), RandomHorizontalFlip(), ColorJitter(0.3, 0.3, 0.3, 0.05)]
    common = dict(batch_size=8, seed=1, augment=augment, device="cpu", normalize=True)
    threads = make_loader(ds, **common, augment_on="threads")
    device = make_loader(ds, **common, augment_on="device", channels_last=True)
    assert "augment on cpu" in device.mode
    x, y = _epoch(threads)
    d, z = _epoch(device)
    assert torch.equal(y, z) and d.dtype == torch.float32 and x.shape == d.shape
    assert d.is_contiguous(memory_format=torch.channels_last)
    std = torch.tensor(ds.manifest.std).view(1, 3, 1, 1)
    diff = ((x - d) * std * 255).abs()  # back in 8-bit levels
    assert diff.mean() < 1.0 and diff.max() <= 12


def test_mid_epoch_resume_with_augmentation_yields_exactly_the_remaining_batches(small_cache):
    from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

    ds = CachedDataset(small_cache)
    augment = [RandomResizedCrop(16), RandomHorizontalFlip()]
    loader = make_loader(ds, batch_size=6, seed=8, augment=augment)
    _epoch(loader)  # epoch 0
    batches = iter(loader)  # epoch 1
    first = [next(batches) for _ in range(3)]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 18
    full = make_loader(ds, batch_size=6, seed=8, augment=augment)
    full.set_epoch(1)
    expected = list(full)
    resumed = make_loader(ds, batch_size=6, seed=8, augment=augment)
    resumed.load_state_dict(state)
    got = first + list(resumed)
    assert len(got) == len(expected)
    for (a, y), (b, z) in zip(got, expected):
        assert torch.equal(a, b) and torch.equal(y, z)


def test_output_dtype_layout_and_scaling(small_cache):
    ds = CachedDataset(small_cache)
    raw = ds.read_batch(range(8))[0].float() / 255
    half = make_loader(
        ds, batch_size=8, shuffle=False, device="cpu", dtype=torch.bfloat16, channels_last=True
    )
    x, _ = next(iter(half))
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(x.float(), raw, atol=4e-3, rtol=0)
    norm = make_loader(ds, batch_size=8, shuffle=False, device="cpu", dtype=torch.float16, normalize=True)
    mean = torch.tensor(ds.manifest.mean).view(1, 3, 1, 1)
    std = torch.tensor(ds.manifest.std).view(1, 3, 1, 1)
    torch.testing.assert_close(next(iter(norm))[0].float(), (raw - mean) / std, atol=2e-2, rtol=1e-2)
    floats = CachedDataset(small_cache, transform=lambda t: t.float() / 255)  # already in [0, 1]
    loader = make_loader(floats, batch_size=8, shuffle=False, workers=0, device="cpu", dtype=torch.float32)
    torch.testing.assert_close(next(iter(loader))[0], raw)  # not divided by 255 a second time
    with pytest.raises(ValueError, match="floating point"):
        make_loader(ds, batch_size=8, dtype=torch.int32)


def test_a_rank_without_batches_is_an_error_not_a_hang(small_cache):
    ds = CachedDataset(small_cache)
    with pytest.raises(ValueError, match="no batches"):
        make_loader(ds, batch_size=64, drop_last=True)
    assert len(make_loader(ds, batch_size=64)) == 1


def test_variable_sized_samples_train_with_crops_and_evaluate_with_center_crops(mixed_tree, tmp_path):
    from cachekit import BuildConfig, build
    from cachekit.transforms import CenterCrop, RandomResizedCrop, Resize

    build(mixed_tree, tmp_path / "c", BuildConfig(pipeline="train-256", size=48, workers=1, progress=False))
    ds = CachedDataset(tmp_path / "c")
    assert ds.ragged
    train = make_loader(ds, batch_size=3, augment=[RandomResizedCrop(32)])
    x, y = _epoch(train)
    assert x.shape == (len(ds), 3, 32, 32)
    val = make_loader(ds, batch_size=3, shuffle=False, augment=[Resize(48), CenterCrop(40)])
    v, labels = _epoch(val)
    for i in range(len(ds)):
        img = ds[i][0]
        h, w = img.shape[1:]
        top, left = int(round((h - 40) / 2)), int(round((w - 40) / 2))
        assert torch.equal(v[i], img[:, top : top + 40, left : left + 40])  # the short side is 48 already
    on_device = make_loader(
        ds, batch_size=3, shuffle=False, augment=[CenterCrop(40)], device="cpu", augment_on="device"
    )
    assert torch.equal(_epoch(on_device)[0], v)


def _augmenting_rank(rank, world, init_method, cache, results):
    import torch.distributed as dist
    from distgroup import join_group

    from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

    join_group(rank, world, init_method)
    try:
        ds = CachedDataset(cache)
        loader = make_loader(
            ds, batch_size=4, seed=5, augment=[RandomResizedCrop(16), RandomHorizontalFlip()]
        )
        epochs = []
        for _ in range(2):  # no set_epoch: the ranks advance together by themselves
            batches = [(x.clone(), y.clone()) for x, y in loader]
            count = torch.tensor([len(batches)])
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            epochs.append((batches, int(count)))
        results[rank] = (epochs, loader.sampler.epoch)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_of_a_gloo_group_augment_their_own_share_in_step(small_cache, tmp_path):
    import torch.multiprocessing as tmp_mp
    from distgroup import rendezvous

    from cachekit.augment.plan import compile_plan
    from cachekit.feed.assemble import BatchRequest
    from cachekit.feed.sampler import ShardAwareDistributedSampler
    from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

    results = tmp_mp.Manager().dict()
    tmp_mp.spawn(_augmenting_rank, args=(2, rendezvous(tmp_path), str(small_cache), results), nprocs=2)
    ds = CachedDataset(small_cache)
    plan = compile_plan([RandomResizedCrop(16), RandomHorizontalFlip()])
    for rank in range(2):
        epochs, last_epoch = results[rank]
        assert last_epoch == 1
        for epoch, (batches, most) in enumerate(epochs):
            assert len(batches) == most == 5  # 40 samples / 2 ranks / batch 4: every rank in step
            sampler = ShardAwareDistributedSampler(ds, num_replicas=2, rank=rank, seed=5)
            sampler.set_epoch(epoch)
            indices = list(sampler)
            for k, (x, y) in enumerate(batches):
                expected = ds.read_request(
                    BatchRequest(indices[4 * k : 4 * k + 4], epoch=epoch, seed=5, plan=plan)
                )
                assert torch.equal(x, expected.images) and torch.equal(y, expected.labels)


@pytest.mark.parametrize("prefetch_factor, set_epoch", [(None, False), (4, False), (None, True)])
def test_a_state_saved_between_epochs_after_set_augment_resumes_with_the_new_plan(
    small_cache, prefetch_factor, set_epoch
):
    # the usual checkpoint: an epoch ends (set_epoch(1) or not), close_mosaic-style set_augment, state_dict
    from cachekit.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop

    a, b = [RandomResizedCrop(16), RandomHorizontalFlip()], [CenterCrop(24), RandomHorizontalFlip()]
    ds = CachedDataset(small_cache)
    kwargs = {} if prefetch_factor is None else {"prefetch_factor": prefetch_factor}
    loader = make_loader(ds, 8, seed=9, augment=a, **kwargs)
    first = [x.clone() for x, _ in loader]  # epoch 0 with a
    if set_epoch:
        loader.set_epoch(1)
    loader.set_augment(b)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == ((1, 0) if set_epoch else (0, len(ds)))
    nxt = [(x.clone(), y.clone()) for x, y in loader]  # epoch 1, with b
    assert {tuple(x.shape[-2:]) for x in first} == {(16, 16)} and {tuple(x.shape[-2:]) for x, _ in nxt} == {(24, 24)}

    resumed = make_loader(ds, 8, seed=9, augment=a, **kwargs)  # made as at the start of the job
    resumed.load_state_dict(state)
    got = [(x.clone(), y.clone()) for x, y in resumed]
    assert resumed.sampler.epoch == 1 and len(got) == len(nxt)
    for (gx, gy), (wx, wy) in zip(got, nxt):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)  # the same samples, the same crops and flips
    again = [x for x, _ in resumed]  # and b goes on after it
    assert {tuple(x.shape[-2:]) for x in again} == {(24, 24)}
