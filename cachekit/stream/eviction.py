"""Eviction that knows the order: the node cache lets go first of the shard needed furthest ahead (Belady).

The sampler's order is known in advance, for this epoch and the next, so the processes that plan
reads (one per rank: ``ShardFetcher``) publish it on a *plan board* in the cache's node folder:
a small file per planner, ``.plan-<pid>-<n>``, holding for every shard the first and last sample
position at which this pass reads it and the first at which the next epoch does, plus how far the
pass has got. The file is held with a shared ``flock`` while its planner lives, so a planner that
died is known (its file is removed). Any process that must make room, a worker process too, reads
the board and evicts, among the copies nobody pins, first those no plan needs (least recently used
first), then the one needed furthest ahead. With a limit under a node's partition this is what
keeps the downloads of an epoch near the fewest possible (``fewest_downloads``), where least
recently used first drops the shards the next epoch needs first.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["PlanBoard", "fewest_downloads"]

_MAGIC = b"CKPLAN1\0"
_HEAD = struct.Struct("<8sqq")  # magic, position, shards
_NEVER = np.iinfo(np.int64).max
_PREFIX, _TEMP = ".plan-", ".plantmp-"
_serial = itertools.count()


def _nofollow(flags: int) -> int:
    return flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _firsts_lasts(shards: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Position of the first and last sample of each of ``count`` shards in ``shards`` (never: max)."""
    first = np.full(count, _NEVER, dtype=np.int64)
    last = np.full(count, -1, dtype=np.int64)
    if len(shards):
        ids, at = np.unique(shards, return_index=True)
        first[ids] = at
        ids, back = np.unique(shards[::-1], return_index=True)
        last[ids] = len(shards) - 1 - back
    return first, last


class PlanBoard:
    """The plans of every reading process of the node for the cache in ``folder`` (shard files ``names``)."""

    def __init__(self, folder: str | os.PathLike, names: list[str]) -> None:
        self.folder = Path(folder)
        self.names = names if isinstance(names, Sequence) else list(names)  # a view of the index, or a list
        self._lookup: dict[str, int] | None = None  # name -> shard, made when eviction first needs it
        self._fd: int | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fd"] = None  # a plan belongs to the process that made it
        state["_lookup"] = None
        return state

    @property
    def _index(self) -> dict[str, int]:
        if self._lookup is None:
            self._lookup = {name: k for k, name in enumerate(self.names)}
        return self._lookup

    # -- a planner's side -------------------------------------------------------------------------

    def _file(self) -> int:
        if self._pid != os.getpid():  # forked: the parent's plan is the parent's
            self._fd, self._pid = None, os.getpid()
        if self._fd is None:  # made under a temp name, locked, then renamed: never seen unlocked
            tag = f"{os.getpid()}-{next(_serial)}"
            temp = self.folder / f"{_TEMP}{tag}"
            fd = os.open(temp, _nofollow(os.O_RDWR | os.O_CREAT | os.O_EXCL), 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.replace(temp, self.folder / f"{_PREFIX}{tag}")
            self._fd = fd
        return self._fd

    def publish(self, shards: np.ndarray, following: np.ndarray | None = None) -> None:
        """This process reads samples of ``shards`` (a shard number per sample, in order) this pass,
        then those of ``following`` (the next epoch, when known)."""
        count = len(self.names)
        first, last = _firsts_lasts(np.asarray(shards, dtype=np.int64), count)
        nxt, _ = _firsts_lasts(np.asarray(following if following is not None else [], dtype=np.int64), count)
        nxt = np.where(nxt == _NEVER, _NEVER, nxt + len(shards))
        body = _HEAD.pack(_MAGIC, 0, count) + np.stack([first, last, nxt]).astype("<i8").tobytes()
        try:
            fd = self._file()
            os.pwrite(fd, body, 0)
            os.ftruncate(fd, len(body))
        except OSError:  # a plan that cannot be written only makes eviction least recently used
            self.close()

    def advance(self, position: int) -> None:
        """This process has handed out its pass's first ``position`` samples."""
        if self._fd is not None and self._pid == os.getpid():
            try:
                os.pwrite(self._fd, struct.pack("<q", int(position)), 8)
            except OSError:
                self.close()

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)  # the file stays until an evictor sees it unlocked
        self._fd = None

    # -- an evictor's side ------------------------------------------------------------------------

    def _plans(self) -> list[tuple[int, np.ndarray]]:
        """(position, [first, last, next] rows) of every live planner; dead planners' files go."""
        import fcntl

        plans = []
        try:
            files = [p for p in self.folder.iterdir() if p.name.startswith((_PREFIX, _TEMP))]
        except OSError:
            return plans
        for path in files:
            try:
                fd = os.open(path, _nofollow(os.O_RDONLY))
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(path)  # nobody holds it: its planner is gone
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    continue
                if path.name.startswith(_TEMP):
                    continue
                data = os.pread(fd, _HEAD.size + 24 * len(self.names), 0)
            finally:
                os.close(fd)
            if len(data) != _HEAD.size + 24 * len(self.names):
                continue  # being written, or another cache's: skipped
            magic, position, count = _HEAD.unpack_from(data)
            if magic != _MAGIC or count != len(self.names):
                continue
            plans.append((position, np.frombuffer(data, "<i8", offset=_HEAD.size).reshape(3, count)))
        return plans

    def distances(self) -> np.ndarray:
        """Samples until each shard is next needed, the nearest of every planner's (max: none needs it)."""
        best = np.full(len(self.names), _NEVER, dtype=np.int64)
        for position, (first, last, nxt) in self._plans():
            this = np.where(last >= position, np.maximum(first - position, 0), _NEVER)
            later = np.where(nxt == _NEVER, _NEVER, nxt - position)
            best = np.minimum(best, np.minimum(this, later))
        return best

    def order(self, entries: list) -> list:
        """``entries`` (``(mtime, bytes, path, lock)`` of the node cache, least recently used first)
        in the order to evict: those no plan needs as they came, then the one needed furthest ahead."""
        distances = self.distances()
        own = str(self.folder)

        def key(item: tuple[int, tuple]) -> tuple:
            at, entry = item
            path = entry[2]
            k = self._index.get(path.name) if str(path.parent) == own else None
            d = _NEVER if k is None else int(distances[k])
            return (d != _NEVER, -d, at)

        return [entry for _, entry in sorted(enumerate(entries), key=key)]

    def worth_fetching(self, name: str, need: int, entries: list, max_bytes: int) -> bool:
        """Whether fetching ``name`` ahead (``need`` bytes) would only evict copies needed later than it."""
        total = sum(entry[1] for entry in entries)
        if total + need <= max_bytes:
            return True
        distances = self.distances()
        k = self._index.get(name)
        mine = _NEVER if k is None else int(distances[k])
        own = str(self.folder)
        later = 0
        for entry in entries:
            j = self._index.get(entry[2].name) if str(entry[2].parent) == own else None
            if j is None or distances[j] > mine:
                later += entry[1]
        return total - later + need <= max_bytes


def fewest_downloads(sequence, sizes: dict | None = None, capacity: int = 1) -> int:
    """Downloads Belady's rule needs for the shard ``sequence`` (in order of use) in ``capacity``
    bytes (``sizes[shard]`` bytes each; one each without ``sizes``): on a miss, evict the shard
    needed furthest ahead until the new one fits. Optimal for shards of one size."""
    seq = list(sequence)
    nxt, seen = [0] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = seen.get(seq[i], len(seq))
        seen[seq[i]] = i
    size = (lambda s: sizes[s]) if sizes is not None else (lambda s: 1)
    held: dict = {}
    used = downloads = 0
    for i, shard in enumerate(seq):
        if shard not in held:
            downloads += 1
            used += size(shard)
            while used > capacity and held:
                victim = max(held, key=held.get)
                used -= size(victim)
                del held[victim]
        held[shard] = nxt[i]
    return downloads
