"""``make_loader``'s default seed follows torch's (``torch.manual_seed``), and is one seed on every rank."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp_mp
from distgroup import join_group, rendezvous

from cachekit import CachedDataset, make_loader
from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

AUGMENT = [RandomResizedCrop(16), RandomHorizontalFlip()]


def _epoch(cache) -> tuple[list[int], torch.Tensor]:
    loader = make_loader(CachedDataset(cache), 8, augment=AUGMENT)
    batches = list(loader)
    return torch.cat([y for _, y in batches]).tolist(), torch.cat([x for x, _ in batches])


def test_the_default_seed_is_torchs(small_cache):
    torch.manual_seed(1)
    one = _epoch(small_cache)
    torch.manual_seed(1)
    again = _epoch(small_cache)
    torch.manual_seed(2)
    other = _epoch(small_cache)
    assert one[0] == again[0] and torch.equal(one[1], again[1])
    assert one[0] != other[0] and not torch.equal(one[1], other[1])  # another order, other crops
    explicit = make_loader(CachedDataset(small_cache), 8, seed=5)
    torch.manual_seed(3)
    assert [y.tolist() for _, y in explicit] == [
        y.tolist() for _, y in make_loader(CachedDataset(small_cache), 8, seed=5)
    ]


def _rank(rank, world, init_method, cache, results):
    join_group(rank, world, init_method)
    try:
        torch.manual_seed(100 + rank)  # every rank its own torch seed, as scripts often leave them
        loader = make_loader(CachedDataset(cache), 4, augment=AUGMENT, shuffle=True)
        results[rank] = {"seed": loader._request_options["seed"], "indices": list(loader.sampler)}
    finally:
        dist.destroy_process_group()


def test_ranks_share_rank_zeros_seed(small_cache, tmp_path):
    results = tmp_mp.Manager().dict()
    tmp_mp.spawn(_rank, args=(2, rendezvous(tmp_path), str(small_cache), results), nprocs=2)
    assert results[0]["seed"] == results[1]["seed"]
    torch.manual_seed(100)
    assert results[0]["seed"] == torch.initial_seed()
    a, b = results[0]["indices"], results[1]["indices"]
    assert not set(a) & set(b) and len(a) + len(b) == len(CachedDataset(small_cache))  # one order, dealt out


def test_a_chosen_seed_resumes_as_the_saved_job_s(small_cache):
    """seed=None is each process's torch seed: a resumed process takes the saved order and crops."""
    torch.manual_seed(11)
    loader = make_loader(CachedDataset(small_cache), 4, augment=AUGMENT)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = [y.tolist() for _, y in it]
    torch.manual_seed(12)  # another process, another torch seed
    resumed = make_loader(CachedDataset(small_cache), 4, augment=AUGMENT)
    resumed.load_state_dict(state)
    again = list(resumed)
    assert [y.tolist() for _, y in again] == rest and first
    explicit = make_loader(CachedDataset(small_cache), 4, seed=99)
    import pytest

    with pytest.raises(ValueError, match="seed="):
        explicit.load_state_dict(state)
