"""``ShardAwareDistributedSampler``: DistributedSampler semantics with shard-local shuffling.

Each epoch the shard order is shuffled, then samples are shuffled inside windows of a few shards
at a time, so a rank's reads stay within a handful of shards (sequential I/O, warm page cache)
while every sample still moves around from epoch to epoch. Ranks get contiguous runs of that
order, so each rank touches mostly its own shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from ..constants import SHUFFLE_WINDOW_SHARDS

__all__ = ["ShardAwareDistributedSampler", "epoch_order"]


def epoch_order(
    shard_offsets: np.ndarray, seed: int, epoch: int, shuffle: bool, window: int, group: int = 1
) -> np.ndarray:
    """The global sample order of one epoch, before it is split between ranks.

    With ``group`` > 1, runs of ``group`` consecutive samples (one input's variants) move together.
    """
    n = int(shard_offsets[-1])
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    shards = rng.permutation(len(shard_offsets) - 1)
    parts = []
    for start in range(0, len(shards), max(1, window)):
        members = shards[start : start + window]
        idx = np.concatenate([np.arange(shard_offsets[s], shard_offsets[s + 1]) for s in members])
        parts.append(rng.permutation(idx.reshape(-1, group)).reshape(-1))
    return np.concatenate(parts).astype(np.int64) if parts else np.arange(0, dtype=np.int64)


class ShardAwareDistributedSampler(Sampler[int]):
    """Like ``torch.utils.data.DistributedSampler``, for a dataset with ``shard_offsets``.

    Every rank yields the same number of indices; together they cover the dataset, padded by
    repeating the start of the order when it does not divide evenly (as torch does) or truncated
    with ``drop_last``. The order is a function of (seed, epoch, world size) alone.
    ``state_dict``/``load_state_dict`` resume in the middle of an epoch.

    ``group_size`` (default: the dataset's, i.e. the augmented variants per input) keeps each run
    of that many consecutive samples on one rank in an epoch; each rank then shuffles its share.
    """

    def __init__(
        self,
        dataset,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        window: int = SHUFFLE_WINDOW_SHARDS,
        group_size: int | None = None,
    ) -> None:
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"invalid rank {rank} for {num_replicas} replicas")
        offsets = getattr(dataset, "shard_offsets", None)
        if offsets is None:
            offsets = np.array([0, len(dataset)], dtype=np.int64)
        self.shard_offsets = np.asarray(offsets, dtype=np.int64)
        self.dataset_len = int(self.shard_offsets[-1])
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.window = shuffle, seed, drop_last, window
        self.epoch = 0
        self.group_size = int(group_size or getattr(dataset, "group_size", 1))
        if self.group_size < 1 or self.dataset_len % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide the {self.dataset_len} samples")
        groups = self.dataset_len // self.group_size
        per_rank = groups // num_replicas if drop_last else math.ceil(groups / num_replicas)
        self.num_samples = per_rank * self.group_size
        self.total_size = self.num_samples * num_replicas
        self._start = 0  # samples of the current epoch already consumed (set by load_state_dict)
        self._yielded = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._start = 0
        self.epoch = epoch

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, in order."""
        g = self.group_size
        order = epoch_order(self.shard_offsets, self.seed, self.epoch, self.shuffle, self.window, g)
        if self.drop_last:
            order = order[: self.total_size]
        elif len(order) < self.total_size:
            pad = self.total_size - len(order)  # whole groups, since both sizes are multiples of g
            order = np.concatenate([order, np.tile(order, math.ceil(pad / max(1, len(order))))[:pad]])
        begin = self.rank * self.num_samples
        mine = order[begin : begin + self.num_samples]
        if g > 1 and self.shuffle:  # don't hand a batch one image's variants in a row
            mine = np.random.default_rng([self.seed, self.epoch, self.rank]).permutation(mine)
        return mine

    def __iter__(self) -> Iterator[int]:
        start, self._start = self._start, 0
        self._yielded = start
        for i in self.indices()[start:].tolist():
            self._yielded += 1
            yield i

    def __len__(self) -> int:
        return self.num_samples - self._start

    def state_dict(self, consumed: int | None = None) -> dict:
        """Where this rank is: pass ``consumed`` (samples the training loop actually used) when a
        loader prefetches ahead of it; by default, the indices this sampler has handed out."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "consumed": self._yielded if consumed is None else int(consumed),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_replicas") != self.num_replicas or state.get("seed") != self.seed:
            raise ValueError(
                f"sampler state is for seed {state.get('seed')} and {state.get('num_replicas')} replicas, "
                f"not seed {self.seed} and {self.num_replicas}"
            )
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"consumed={consumed} is outside this epoch's {self.num_samples} samples")
        self.epoch = int(state["epoch"])
        self._start = consumed
        self._yielded = consumed
