"""``ShareSampler``: the sampler ``make_loader`` gives its loader, a ``ShardAwareDistributedSampler`` that is
also an instance of torch's ``DistributedSampler``.

Trainers that shard a loader over their process group (Lightning's ``Trainer`` and ``Fabric``) put a
``DistributedSampler`` in front of its sampler unless it is one already: over a sampler that already
deals this rank its share, each rank would then read half of its half (seen: 10 of 40 samples per
rank of 2, with the loader rebuilt from its arguments). Being one, the loader is left as it is, and
the trainer's ``set_epoch`` calls reach the sampler itself. Every method ``DistributedSampler`` has
is ``ShardAwareDistributedSampler``'s own; its constructor is not run.
"""

from __future__ import annotations

from torch.utils.data import DistributedSampler

from .sampler import ShardAwareDistributedSampler

__all__ = ["ShareSampler"]


class ShareSampler(ShardAwareDistributedSampler, DistributedSampler):
    """``ShardAwareDistributedSampler``, which trainers recognise as already dealing each rank its share."""
