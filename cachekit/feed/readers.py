"""A bounded pool of open shard readers: the least recently used is closed first, sized by the open-file limit.

An open shard reader holds a memory map and, for compressed HDF5, its open file. A dataset that
kept every shard it touched open would run out of descriptors (HDF5 failed at ~500 shards under
the usual limit of 1,024; ImageNet at the default shard size has ~1,440) and gather maps without
end. The pool keeps at most ``capacity`` readers, closing the least recently used when it needs
room. Closing never pulls data from under a caller: a reader still in use when it is evicted (a
batch being assembled holds the readers of its samples) is closed only once its user lets go of
it, batches are copies, and a memory map goes only with the last array viewing it.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable

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
# getrefcount's argument, the loop variable and the retired list: the references of an unused reader.
_FREE_REFS = 3


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

    Thread-safe. A reader evicted while some caller still holds it (a read in flight in another
    thread, or the caller's own local variable) is closed only once nothing but the pool refers
    to it, the same proof of disuse ``BufferPool`` relies on: evicting never breaks a read.
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise UsageError(f"max_open_shards must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._retired: list[ShardReader] = []  # evicted, waiting for their last user to let go
        self._lock = threading.Lock()
        #: Readers opened and closed over the pool's life (a reopened shard counts again).
        self.opened = self.closed = 0

    def __reduce__(self):
        """A pool pickles empty: open readers never travel to another process."""
        return (ReaderPool, (self.capacity,))

    def __len__(self) -> int:
        """Readers open now, those evicted but still in use included."""
        return len(self._readers) + len(self._retired)

    def __contains__(self, shard: int) -> bool:
        return shard in self._readers

    def get(self, shard: int, open_reader: Callable[[], ShardReader]) -> ShardReader:
        """The open reader of ``shard``, opening it with ``open_reader()`` (closing others) if needed."""
        with self._lock:
            if self._retired:
                self._close_retired()
            reader = self._readers.get(shard)
            if reader is not None:
                self._readers.move_to_end(shard)
                return reader
            while len(self._readers) >= self.capacity:
                self._evict_one()
            try:
                reader = open_reader()
            except OpenFilesExhausted:
                # Something else holds descriptors too: make room among ours and try once more.
                for _ in range(max(1, len(self._readers) // 2)):
                    if self._readers:
                        self._evict_one()
                try:
                    reader = open_reader()
                except OpenFilesExhausted as exc:
                    raise CacheError(
                        f"{exc}: this process is out of file descriptors (limit {open_file_limit()}, "
                        f"{len(self)} shards open); raise the limit (ulimit -n) or lower "
                        "max_open_shards / CACHEKIT_MAX_OPEN_SHARDS"
                    ) from None
            self.opened += 1
            self._readers[shard] = reader
            return reader

    def _evict_one(self) -> None:
        _, reader = self._readers.popitem(last=False)
        self._retired.append(reader)
        del reader
        self._close_retired()

    def _close_retired(self) -> None:
        keep = []
        for reader in self._retired:
            # references: the list, this loop's variable, getrefcount's argument
            if sys.getrefcount(reader) <= _FREE_REFS:
                reader.close()
                self.closed += 1
            else:
                keep.append(reader)
        self._retired = keep

    def tidy(self) -> None:
        """Close the evicted readers nothing uses any more (a reader asks for none of them)."""
        with self._lock:
            self._close_retired()

    def close(self) -> None:
        """Close every open reader (a caller must not be reading from this pool meanwhile)."""
        with self._lock:
            readers = [*self._retired, *self._readers.values()]
            self._readers, self._retired = OrderedDict(), []
            for reader in readers:
                reader.close()
                self.closed += 1

    def forget(self) -> None:
        """Drop the readers without closing them: they belong to the parent of a forked process.

        The lock is replaced too: another thread of the parent may have held it at the fork.
        """
        self._readers, self._retired = OrderedDict(), []
        self._lock = threading.Lock()
