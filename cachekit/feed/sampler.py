"""``ShardAwareDistributedSampler``: DistributedSampler semantics, class-mixed batches, a new order every pass.

An epoch's order is one global sequence of sample indices, a function of (seed, epoch) alone (each
rank computes only its own positions of it, ``order.units_at``):
the shards in a shuffled order, their samples shuffled within blocks of ``window`` samples (whole
shards; the first blocks of an epoch one or two shards), so reads stay within a few shards at a
time (sequential I/O, a warm page cache, few downloads, a first batch after one shard). That is
only safe when every shard is itself a mix of classes (caches built in the default shuffled
order); for other caches the window is the whole dataset, a uniform shuffle.

Position ``p`` of the sequence goes to rank ``p % world``, as in torch's ``DistributedSampler``.
After every rank has consumed ``c`` samples the global position is ``c * world``, so a job resumed
with another world size continues from there and consumes each remaining sample exactly once.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterator

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ..constants import MAX_EPOCH
from ..cpus import local_world_size
from .order import (
    DEFAULT_GROUP_SPREAD,
    default_window,
    epoch_order,
    node_partitions,
    pad_positions,
    slot_of_rank,
    spread_groups,
    units_at,
)
from .samplerstate import (
    adopted_partitions,
    adopted_seed,
    check_same_order,
    check_saved_cache,
    is_count,
    saved_epoch_and_world,
    shown,
    state_of,
)
from .sharepages import PAGE, PagedShare

__all__ = ["ShardAwareDistributedSampler", "epoch_order", "default_window"]


class ShardAwareDistributedSampler(DistributedSampler):
    """Like ``torch.utils.data.DistributedSampler``, for a dataset with ``shard_offsets``; one too (every
    method its own, torch's constructor never run), so trainers that put a ``DistributedSampler`` in
    front of a loader's sampler unless it is one (Lightning's ``Trainer`` and ``Fabric``: each rank
    of 2 read 10 of its 20 samples) leave it as it is, and their ``set_epoch`` reaches it.

    Every rank yields the same number of indices; together they cover the dataset, padded by
    repeating the start of the order when it does not divide evenly (as torch does), or truncated
    with ``drop_last``. The order is a function of (seed, epoch) alone.

    - ``window``: samples shuffled together, in blocks of whole shards (default:
      ``default_window``: a few shards' worth for class-mixed caches, the whole dataset
      otherwise). On class-mixed caches (or a window under the dataset) the first blocks of an
      epoch hold 1, 1, 2, 3, ... shards, so the first batches need few shards.
    - ``auto_epoch`` (default True): each new pass over the sampler is the next epoch, so a plain
      ``for epoch ...: for batch in loader`` reshuffles; ``set_epoch(e)`` still sets it exactly.
    - ``group_size`` (default: the dataset's augmented variants per input) keeps each input's
      variants on one rank in an epoch, never in one batch.
    - ``partitions`` (default: one per node for caches on object storage, else 1): the samples
      are split into that many fixed sets of whole shards (and at most two shared parts of shards
      at the cuts) and each node's ranks read their own, every epoch, padded within it as torch
      pads: a node reads the same shards every epoch and its node-local shard cache stays warm.
    - ``group_spread`` (default 64; ``make_loader`` passes its batch size): samples between two
      variants of one input, so that they never share a batch.
    - ``state_dict``/``load_state_dict`` resume mid-epoch exactly; with another world size too
      (for caches with variants, at an epoch boundary); a state saved at the end of an epoch
      resumes with the next one.
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
        window: int | None = None,
        group_size: int | None = None,
        auto_epoch: bool = True,
        partitions: int | None = None,
        group_spread: int | None = None,
    ) -> None:
        num_replicas, rank = _placement(num_replicas, rank)
        self.shard_offsets = _shard_offsets(dataset)
        self.dataset_len = int(self.shard_offsets[-1])
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        #: The seed was chosen for the user (``make_loader(seed=None)``): a saved state's is adopted.
        self.seed_chosen = False
        self.group_size = int(group_size or getattr(dataset, "group_size", 1))
        if self.group_size < 1 or self.dataset_len % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide the {self.dataset_len} samples")
        local = local_world_size()
        explicit_partitions = partitions is not None
        if partitions is None:
            partitions = node_partitions(dataset, num_replicas, local) if self.group_size == 1 else 1
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        #: A dataset that orders its own epochs (``cachekit.mix``): ``epoch_order(seed, epoch, ...)``.
        self._order_of = getattr(dataset, "epoch_order", None)
        self._own_len = getattr(dataset, "epoch_len", None)
        #: A pass hands out its share a page at a time, never whole (a mix's epoch may hold 2**28
        #: samples); a mix on object storage plans its downloads with the whole share, as a cache does.
        self._paged = self._order_of is not None and not getattr(dataset, "url", None)
        self._set_window(dataset, window, local, partitions)
        if partitions > 1 and self.group_size > 1:
            raise ValueError("an augmented cache's variants are dealt per rank: use partitions=1")
        self._local = local
        self._most_partitions = int(getattr(dataset, "max_partitions", self.dataset_len))
        self._set_partitions(partitions)
        self._own_partitions = None if explicit_partitions else self.partitions  # the default: later epochs
        self.group_spread = DEFAULT_GROUP_SPREAD if group_spread is None else int(group_spread)
        if self.group_spread < 1:
            raise ValueError(f"group_spread must be at least 1 sample, got {group_spread}")
        manifest = getattr(dataset, "manifest", None)
        self.fingerprint = getattr(dataset, "fingerprint", None) or getattr(manifest, "fingerprint", None)
        self.auto_epoch = auto_epoch
        self.epoch = 0
        self._sizes()
        self._start = 0  # global position the next pass starts from (set by load_state_dict)
        self._fresh = True  # no pass has started since construction, set_epoch or load_state_dict
        self._pass_start = self._pass_len = self._yielded = 0
        self.last_indices = np.zeros(0, dtype=np.int64)

    def _set_window(self, dataset, window, local: int, partitions: int) -> None:
        """``window`` (default: a mix's own, else ``default_window``), and whether an epoch ramps up."""
        if window is None and self._order_of is not None:
            window = dataset.windows
        elif window is None:
            window = default_window(dataset, self.dataset_len, local, partitions)
        self.window = [int(w) for w in window] if isinstance(window, (list, tuple)) else int(window)
        if min(self.window if isinstance(self.window, list) else [self.window]) < 1:
            raise ValueError(f"window must be at least 1 sample, got {window}")
        #: The first blocks of an epoch small (safe when shards are class-mixed, or asked for by a window).
        self.ramp = bool(getattr(dataset, "shards_mixed", False)) or (
            isinstance(self.window, int) and self.window < self.dataset_len
        )

    def _set_partitions(self, partitions: int) -> None:
        most = min(len(self.shard_offsets) - 1, self._most_partitions)
        self.partitions = min(int(partitions), max(1, most))
        self._slot = slot_of_rank(self.rank, self.num_replicas, self.partitions, self._local)

    def _sizes(self) -> None:
        """Epoch length and shares (an epoch's order is every unit once, plus nothing)."""
        if self._order_of is not None:  # a mix's own order: its length known without building it
            own = self._own_len
            units = int(own) if own is not None else len(self.order())
        else:
            units = self.dataset_len // self.group_size
        self.epoch_len = units * self.group_size
        self.num_samples = self._per_rank(self.epoch_len)  # a whole epoch's share of one rank
        self.total_size = self.num_samples * self.num_replicas

    def _per_rank(self, remaining: int, world: int | None = None) -> int:
        """Samples per rank for ``remaining`` samples: whole units of ``group_size`` each."""
        units, world = remaining // self.group_size, world or self.num_replicas
        return (units // world if self.drop_last else math.ceil(units / world)) * self.group_size

    def _own_order(self) -> None:
        """Back to this job's default partitions after an epoch resumed with a saved job's."""
        if self._own_partitions is not None and self._own_partitions != self.partitions:
            self._set_partitions(self._own_partitions)
            self._sizes()

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (a resumed epoch keeps its resume position)."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral):
            raise ValueError(f"epoch must be an integer, got {shown(epoch)}")
        if not 0 <= int(epoch) <= MAX_EPOCH:
            raise ValueError(f"epoch must be from 0 to {MAX_EPOCH}, got {shown(epoch)}")
        if epoch != self.epoch:
            self._start = 0
        self.epoch = int(epoch)
        self._fresh = True

    def begun(self) -> bool:
        """True once a pass has begun since construction, ``set_epoch`` or ``load_state_dict``."""
        return not self._fresh

    def upcoming_epoch(self) -> int:
        """The epoch the next pass will be (the current one until a pass begins; then the next)."""
        return self.epoch + 1 if not self._fresh and self.auto_epoch else self.epoch

    def order(self, epoch: int | None = None) -> np.ndarray:
        """An epoch's unit order (default: the current one), before dealing (every rank computes the same)."""
        if self._order_of is not None:
            epoch = self.epoch if epoch is None else int(epoch)
            return self._order_of(self.seed, epoch, self.shuffle, self.window, self.partitions)
        return epoch_order(
            self.shard_offsets,
            self.seed,
            self.epoch if epoch is None else int(epoch),
            self.shuffle,
            self.window,
            self.group_size,
            self.partitions,
            self.ramp,
        )

    def _units(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The units at ``positions`` of epoch ``epoch``'s order, computed in this rank's share alone
        (a dataset that orders its own epochs gives its whole order)."""
        if self._order_of is not None:
            return self.order(epoch)[positions]
        return units_at(
            self.shard_offsets,
            self.seed,
            epoch,
            positions,
            self.shuffle,
            self.window,
            self.group_size,
            self.partitions,
            self.ramp,
        )

    def _dealt_to(self, epoch: int, rank: int) -> np.ndarray:
        """Variants of one input per rank: rank ``rank``'s samples of an epoch, from its positions
        ``rank, rank + world, ...`` of the unit order (padded from its own start, or of all)."""
        world, g, per = self.num_replicas, self.group_size, self.num_samples
        total = self.dataset_len // g if self._order_of is None else len(self.order(epoch))
        positions = np.arange(rank, total, world, dtype=np.int64)[: per // g]  # drop_last: whole units
        seq = spread_groups(self._units(epoch, positions), g, self.group_spread)
        if len(seq) < per:  # pad by repeating the start of this rank's share (or of all: a tiny cache)
            if not len(seq):
                seq = spread_groups(
                    self._units(epoch, np.arange(total, dtype=np.int64)), g, self.group_spread
                )
            seq = np.resize(seq, per)
        return seq

    def indices(self, epoch: int | None = None, start: int | None = None) -> np.ndarray:
        """This rank's indices for the next pass, in order (from the resume position, if any), or
        for ``epoch`` from global position ``start`` (default 0).

        Only this rank's positions of the epoch's order are computed (``order.units_at``): memory
        in proportion to this rank's samples and its partitions' shards, not the dataset's.
        """
        world = self.num_replicas
        if epoch is None:
            epoch, start = self.epoch, self._start
        start = int(start or 0)
        if self.group_size > 1:  # position e of the dealt epoch: row e // world of rank e % world's share
            if not self.num_samples:
                return np.zeros(0, dtype=np.int64)
            first = start + self.rank
            return self._dealt_to(epoch, first % world)[first // world :]
        length = self.epoch_len
        start = min(start, length)
        return self._units(epoch, self._positions(start, 0, self._per_rank(length - start)))

    def _positions(self, start: int, lo: int, hi: int) -> np.ndarray:
        """Positions ``lo .. hi`` of this rank's share of a pass from global position ``start``:
        ``start + slot + j * world``, those past the epoch padded by repeating the start of the
        order, as torch does, with samples of the partition the rank reads."""
        world, length = self.num_replicas, self.epoch_len
        positions = start + self._slot + world * np.arange(lo, hi, dtype=np.int64)
        past = positions >= length
        if past.any():
            positions[past] = pad_positions(positions[past], length, self.partitions)
        return positions

    def next_indices(self) -> np.ndarray:
        """This rank's indices in the epoch after the current pass (downloads and eviction plan with them)."""
        return self.indices(self.epoch + 1, 0)

    def __iter__(self) -> Iterator[int]:
        if not self._fresh:  # a new pass with no set_epoch since the last one
            if self.auto_epoch:
                self.epoch += 1
            self._start = 0
        if self._start == 0:
            self._own_order()
        self._fresh = False
        if self._paged and self.group_size == 1:
            start = min(self._start, self.epoch_len)
            positions = functools.partial(self._positions, start)
            mine = PagedShare(self.order(self.epoch), positions, self._per_rank(self.epoch_len - start))
        else:
            mine = self.indices()
        self.last_indices = mine  # what this pass hands out, in order (downloads ahead plan with it)
        self._pass_start, self._pass_len, self._yielded = self._start, len(mine), 0
        self._start = 0  # the resume position is used up: running this epoch again starts it over
        for lo in range(0, len(mine), PAGE):  # Python ints a page at a time, never the whole share
            for i in mine[lo : lo + PAGE].tolist():
                self._yielded += 1
                yield i

    def __len__(self) -> int:
        start = self._start if self._fresh else 0
        if self.group_size > 1:
            return max(0, self.num_samples - start // self.num_replicas)
        return self._per_rank(max(0, self.epoch_len - start))

    def _end(self) -> int:
        """The position at which the epoch is over."""
        return self.total_size if self.group_size > 1 else self.epoch_len

    def state_dict(self, consumed: int | None = None) -> dict:
        """Where the job is in the current epoch, for ``load_state_dict`` in this or another world size.

        ``consumed``: samples of this pass the training loop actually used on this rank (a loader
        that reads ahead knows it); by default, the indices this sampler has handed out. Every rank
        is assumed to have consumed as many (DDP steps in lockstep), so the global position is
        ``consumed * world`` past where the pass started.
        """
        if self._fresh:  # no pass since set_epoch or load_state_dict: nothing consumed yet
            position = self._start
        else:
            used = self._yielded if consumed is None else min(int(consumed), self._pass_len)
            position = min(self._end(), self._pass_start + used * self.num_replicas)
        return state_of(self, position)

    def load_state_dict(self, state: dict) -> None:
        """Continue the saved epoch from its global position (the world size may differ)."""
        check_saved_cache(state, self.fingerprint, self.dataset_len)
        partitions = adopted_partitions(state, self._own_partitions, self.partitions)  # None: this job's
        seed = adopted_seed(state, self.seed_chosen)  # None: this sampler's
        mine = {
            "seed": self.seed if seed is None else seed,
            "shuffle": self.shuffle,
            "window": self.window,
            "group_size": self.group_size,
            "partitions": self.partitions if partitions is None else partitions,
        }
        if self.group_size > 1:
            mine["group_spread"] = self.group_spread
        check_same_order(state, mine)
        epoch, world = saved_epoch_and_world(state)
        position, finished = self._saved_position(state.get("position"), world)
        if partitions is not None:  # every check passed: only now does the sampler change
            self._set_partitions(partitions)
            self._sizes()
        if seed is not None:
            self.seed = seed
        self.epoch = int(epoch)
        self._start = 0 if world != self.num_replicas and self.group_size > 1 else position
        self._fresh = True
        if position > 0 and (finished or len(self) == 0):  # saved at the end of its epoch: the next
            self.epoch += 1
            self._start = 0

    def _saved_position(self, position, world: int) -> tuple[int, bool]:
        """A saved global position, checked to lie in the epoch of the ``world`` ranks that saved it,
        and whether that epoch was over there."""
        # where the saved epoch ended, for the world that saved it (variants pad whole units per rank)
        saved_end = self._per_rank(self.dataset_len, world) * world if self.group_size > 1 else self.epoch_len
        if not is_count(position) or not 0 <= position <= max(saved_end, self.epoch_len):
            raise ValueError(f"sampler state position {shown(position)} is outside the epoch")
        finished = position >= saved_end or (  # or too little left for a sample per rank (drop_last)
            self.group_size == 1 and self._per_rank(max(0, saved_end - position), world) == 0
        )
        if world != self.num_replicas and self.group_size > 1 and 0 < position and not finished:
            raise ValueError(
                f"this cache's augmented variants are dealt to ranks per epoch: resume mid-epoch with "
                f"the {world} ranks the state was saved with, or from the start of an epoch"
            )
        return position, finished


def _placement(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """The world size and this rank (default: the process group's, else one process), checked."""
    if num_replicas is None:
        num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"invalid rank {rank} for {num_replicas} replicas")
    return num_replicas, rank


def _shard_offsets(dataset) -> np.ndarray:
    """The dataset's ``shard_offsets``, or one shard of all its samples."""
    offsets = getattr(dataset, "shard_offsets", None)
    if offsets is None:
        offsets = np.array([0, len(dataset)], dtype=np.int64)
    return np.asarray(offsets, dtype=np.int64)
