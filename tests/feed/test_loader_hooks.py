"""What trainers that wrap a loader see of make_loader's: a sampler that is already a DistributedSampler
(so none is put in front of it), and, where asked, the length of a whole epoch while a resumed one runs."""

from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler

from cachekit import CachedDataset, ShardAwareDistributedSampler, make_loader


def test_the_loader_s_sampler_is_a_distributed_sampler_of_its_own(small_cache):
    loader = make_loader(small_cache, batch_size=4, seed=1)
    sampler = loader.sampler
    assert isinstance(sampler, ShardAwareDistributedSampler) and isinstance(sampler, DistributedSampler)
    assert type(sampler).set_epoch is ShardAwareDistributedSampler.set_epoch  # nothing of torch's runs
    assert type(sampler).__iter__ is ShardAwareDistributedSampler.__iter__
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.epoch) == (1, 0, True, 0)
    plain = ShardAwareDistributedSampler(CachedDataset(small_cache), seed=1)
    assert isinstance(plain, DistributedSampler)  # one a user makes for a plain DataLoader too
    assert list(sampler) == list(plain)  # the same order


def test_a_resumed_epoch_can_count_its_whole_length(small_cache):
    loader = make_loader(small_cache, batch_size=4, seed=3)
    batches = iter(loader)
    seen = [next(batches)[1] for _ in range(3)]
    state = loader.state_dict()
    resumed = make_loader(small_cache, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    assert len(resumed) == 7  # the batches left: 40 samples, 3 batches of 4 run
    resumed.whole_epoch_len = True
    assert len(resumed) == 10  # the epoch's, as a loop that adds what it ran before the resume counts
    rest = [y for _, y in resumed]
    assert len(rest) == 7 and len(resumed) == 10
    whole = torch.cat([y for _, y in make_loader(small_cache, batch_size=4, seed=3)])
    assert torch.equal(torch.cat(seen + rest), whole)
    odd = make_loader(small_cache, batch_size=3, seed=3, drop_last=True)
    odd.whole_epoch_len = True
    assert len(odd) == 13 == len(make_loader(small_cache, batch_size=3, seed=3, drop_last=True))
