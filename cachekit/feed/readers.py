"""A bounded pool of open shard readers: the least recently used is closed first, sized by the open-file limit.

An open shard reader holds a memory map and, for compressed HDF5, its open file. A dataset that
kept every shard it touched open would run out of descriptors (HDF5 failed at ~500 shards under
the usual limit of 1,024; ImageNet at the default shard size has ~1,440) and gather maps without
end. The pool keeps at most ``capacity`` readers, closing the least recently used when it needs
room. Closing never pulls data from under a caller: readers are borrowed and released
explicitly (a batch being assembled borrows the readers of its samples), an evicted reader still
borrowed is closed at its last release, batches are copies, and a memory map goes only with the
last array viewing it. No reference counts are guessed (CPython 3.14 borrows stack references).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator

try:
    import resource
except ImportError:  # not on Windows, whose C runtime allows 512 open files by default
    resource = None

from ..constants import MAX_OPEN_SHARDS
from ..errors import CacheError, UsageError
from ..store.formats import OpenFilesExhausted, ShardReader

__all__ = ["ReaderPool", "default_max_open", "open_file_limit"]

#: Share of the process's descriptors the pool may use; the rest stay free for everything else
#: (DataLoader pipes, sockets, the training script's own files).
_SHARE = 0.5
#: Upper bound whatever the limit says: past this many, open shards only cost memory maps.
_MOST = 1024


def open_file_limit() -> int:
    """The process's soft limit on open file descriptors (``RLIMIT_NOFILE``)."""
    if resource is None:
        return 512
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def default_max_open(files_per_reader: int) -> int:
    """How many readers of a format holding ``files_per_reader`` descriptors each may stay open.

    ``CACHEKIT_MAX_OPEN_SHARDS`` overrides it; else half the open-file limit's worth (a format
    that keeps none counts as one), at least 2 and at most 1,024.
    """
    if MAX_OPEN_SHARDS > 0:
        return MAX_OPEN_SHARDS
    return max(2, min(_MOST, int(open_file_limit() * _SHARE) // max(1, files_per_reader)))


class ReaderPool:
    """At most ``capacity`` open shard readers, keyed by shard number, least recently used out first.

    Thread-safe. ``borrow`` hands out a reader and ``release`` gives it back; eviction picks the
    least recently used reader nobody has borrowed, and a borrowed reader that must go anyway (all
    are borrowed) is closed at its last release: evicting never breaks a read.
    ``on_close(shard)`` runs after a reader is closed (a remote cache unpins its local copy).
    """

    def __init__(self, capacity: int, on_close: Callable[[int], None] | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise UsageError(f"max_open_shards must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.on_close = on_close
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._uses: dict[int, int] = {}  # id(reader) -> borrows outstanding
        self._retired: dict[int, tuple[int, ShardReader]] = {}  # id -> (shard, reader) closing at release
        self._lock = threading.Lock()
        #: Readers opened and closed over the pool's life (a reopened shard counts again).
        self.opened = self.closed = 0

    def __reduce__(self):
        """A pool pickles empty: open readers never travel to another process."""
        return (ReaderPool, (self.capacity, self.on_close))

    def __len__(self) -> int:
        """Readers open now, those evicted but still borrowed included."""
        return len(self._readers) + len(self._retired)

    def __contains__(self, shard: int) -> bool:
        return shard in self._readers

    def _close(self, shard: int, reader: ShardReader) -> None:
        reader.close()
        self.closed += 1
        if self.on_close is not None:
            self.on_close(shard)

    def borrow(self, shard: int, open_reader: Callable[[], ShardReader]) -> ShardReader:
        """The open reader of ``shard`` (opened with ``open_reader()`` if needed), borrowed until ``release``."""
        with self._lock:
            reader = self._readers.get(shard)
            if reader is not None:
                self._readers.move_to_end(shard)
            else:
                while len(self._readers) >= self.capacity:
                    self._evict_one()
                reader = self._open(open_reader)
                self.opened += 1
                self._readers[shard] = reader
            self._uses[id(reader)] = self._uses.get(id(reader), 0) + 1
            return reader

    def release(self, reader: ShardReader) -> None:
        """Give back a reader from ``borrow``; an evicted one closes with its last release."""
        with self._lock:
            key = id(reader)
            left = self._uses.get(key, 0) - 1
            if left > 0:
                self._uses[key] = left
                return
            self._uses.pop(key, None)
            retired = self._retired.pop(key, None)
            if retired is not None:
                self._close(*retired)

    @contextlib.contextmanager
    def using(self, shard: int, open_reader: Callable[[], ShardReader]) -> Iterator[ShardReader]:
        reader = self.borrow(shard, open_reader)
        try:
            yield reader
        finally:
            self.release(reader)

    def _open(self, open_reader: Callable[[], ShardReader]) -> ShardReader:
        try:
            return open_reader()
        except OpenFilesExhausted:
            # Something else holds descriptors too: make room among ours and try once more.
            for _ in range(max(1, len(self._readers) // 2)):
                if self._readers:
                    self._evict_one()
            try:
                return open_reader()
            except OpenFilesExhausted as exc:
                raise CacheError(
                    f"{exc}: this process is out of file descriptors (limit {open_file_limit()}, "
                    f"{len(self)} shards open); raise the limit (ulimit -n) or lower "
                    "max_open_shards / CACHEKIT_MAX_OPEN_SHARDS"
                ) from None

    def _evict_one(self) -> None:
        idle = next((s for s, r in self._readers.items() if id(r) not in self._uses), None)
        shard = idle if idle is not None else next(iter(self._readers))
        reader = self._readers.pop(shard)
        if id(reader) in self._uses:
            self._retired[id(reader)] = (shard, reader)
        else:
            self._close(shard, reader)

    def close(self) -> None:
        """Close every open reader (a caller must not be reading from this pool meanwhile)."""
        with self._lock:
            readers = [*self._retired.values(), *self._readers.items()]
            self._readers, self._retired, self._uses = OrderedDict(), {}, {}
            for shard, reader in readers:
                self._close(shard, reader)

    def forget(self) -> None:
        """Drop the readers without closing them: they belong to the parent of a forked process.

        The lock is replaced too: another thread of the parent may have held it at the fork.
        """
        self._readers, self._retired, self._uses = OrderedDict(), {}, {}
        self._lock = threading.Lock()
