"""A dataset's side of a cache on object storage: a filesystem per process, the node's shard copies, downloads ahead.

Safe under fork and spawn: the fsspec filesystem is made afresh in each process that reads (s3fs
instances hold an event loop and sessions that a forked child must not use), and nothing of it
pickles. Shards come from the node-local ``NodeShardCache`` (one download per shard per node);
a reader's shard is pinned while the reader is open; a ``ShardFetcher`` in the process that
plans the order fetches upcoming shards in the background, giving the link to any reader of the
node that waits for a shard (``linkshare``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ..constants import SHUFFLE_BLOCK_SHARDS
from ..cpus import local_world_size
from ..errors import CacheError, UsageError
from ..store.atomic import path_size
from ..store.manifest import Manifest, ShardInfo
from ..store.remote import access_error, filesystem
from .ahead import ShardFetcher
from .copies import record_verified, verified_copy
from .eviction import PlanBoard
from .linkshare import Background, Demand
from .shardcache import NodeShardCache

__all__ = ["RemoteShards", "NodeIndexCopies", "index_folder"]


class NodeIndexCopies:
    """Where a cache's index is kept on the node: beside its shard copies (the folder the node cache
    uses for that fingerprint, private and marked), fetched once and mapped by every process; a copy
    is reused while its record (``copies``: its sha256 and the file's stamp) holds, else hashed."""

    def __init__(self, local_cache: str | os.PathLike | None) -> None:
        self.local_cache = local_cache

    def folder(self, fingerprint: str) -> Path:
        cache = NodeShardCache(self.local_cache, None, fingerprint, 1)
        cache._own_folder()
        return cache.folder

    def verified(self, path: Path, size: int, sha256: str) -> bool:
        return verified_copy(path, size, sha256)

    def record(self, path: Path, sha256: str) -> None:
        record_verified(path, sha256)


def index_folder(local_cache: str | os.PathLike | None) -> NodeIndexCopies:
    """The node's place for the index of a cache on object storage (``read_manifest(index_folder=)``)."""
    return NodeIndexCopies(local_cache)


class RemoteShards:
    """The shards of the cache at ``url`` as local paths, for one dataset in any process."""

    def __init__(
        self,
        url: str,
        manifest: Manifest,
        *,
        storage_options: dict | None = None,
        local_cache: str | os.PathLike | None = None,
        local_cache_bytes: int | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.manifest = manifest
        self.largest = manifest.largest_shard
        self.cache = NodeShardCache(local_cache, local_cache_bytes, manifest.fingerprint, self.largest)
        self.demand = Demand(self.cache.folder)
        names = (
            manifest.shards.names()
            if hasattr(manifest.shards, "names")
            else [s.file for s in manifest.shards]
        )
        self.board = PlanBoard(self.cache.folder, names)
        self.cache.eviction_order = self.board.order  # the shard needed furthest ahead goes first
        self._fs = self._root = None
        self._fs_pid = None
        self._fetcher: ShardFetcher | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fs"] = state["_fs_pid"] = state["_fetcher"] = None
        return state

    def filesystem(self):
        """(fs, root) made in this process."""
        if self._fs is None or self._fs_pid != os.getpid():
            self._fs, self._root = filesystem(self.url, self.storage_options, fresh=True)
            self._fs_pid = os.getpid()
            self._fetcher = None
        return self._fs, self._root

    def block_shards(self, processes: int = 1) -> int:
        """Shards to shuffle together by default: ``SHUFFLE_BLOCK_SHARDS``, or fewer when the node
        cache could not hold a block being read and the next one being fetched (plus one), or the
        two blocks a batch may straddle in each of ``processes`` reading processes."""
        fits = self.cache.max_bytes // max(1, self.largest)
        return max(1, min(SHUFFLE_BLOCK_SHARDS, (fits - 1) // 2, fits // (2 * max(1, processes)) - 1))

    def readers_that_fit(self) -> int:
        """Open readers (pinned shards) one process may hold so that the node's ranks fit the limit."""
        per_node = self.cache.max_bytes // max(1, self.largest)
        return max(1, per_node // (2 * local_world_size()))

    def check_pins(self, shards_per_batch: int, processes: int, batch_bytes: int | None = None) -> None:
        """Refuse a loader whose batches would pin more shards at once than the node cache holds:
        each of ``processes`` reading processes on the node pins the shards of its current batch
        (``batch_bytes`` of them at most, ``stream.pins.bytes_per_batch``; else each the largest)."""
        per_batch = batch_bytes if batch_bytes is not None else shards_per_batch * self.largest
        need = per_batch * processes
        if need > self.cache.max_bytes:
            raise UsageError(
                f"a batch may need {shards_per_batch} shards at once in each of {processes} reading "
                f"processes on this node ({need} bytes), more than local_cache_bytes="
                f"{self.cache.max_bytes}: raise local_cache_bytes, shuffle within fewer shards "
                "(make_loader(window=...)), or build with class-mixed shards (the default --order "
                "shuffled) or smaller shards"
            )

    def check_files(self) -> None:
        fs, root = self.filesystem()
        try:
            listed = {Path(p.rstrip("/")).name for p in fs.ls(root, detail=False)}
        except Exception as exc:  # the filesystem's own errors too (credentials, endpoint): one line
            raise access_error(self.url, exc, CacheError, "list") from None
        missing = [s.file for s in self.manifest.shards if s.file not in listed]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise CacheError(f"{self.url}: shard files missing: {', '.join(missing[:3])}{more}")

    def on_node(self, info: ShardInfo) -> bool:
        """True when the node holds a whole copy of ``info`` (renamed into place: checked when fetched)."""
        try:
            return path_size(self.cache.path(info)) == info.bytes
        except OSError:
            return False

    @contextlib.contextmanager
    def waiting(self, infos: list[ShardInfo]) -> Iterator[None]:
        """While a batch reads ``infos``: those not on the node yet are demanded together, so that
        downloads ahead of any of them carry on and every other download ahead gives way."""
        missing = [info.file for info in infos if not self.on_node(info)]
        if not missing:
            yield
            return
        self.cache._own_folder()
        with self.demand.waiting(*missing):
            yield

    def pin(self, info: ShardInfo) -> Path:
        """The node's copy of ``info``, pinned; while it has to be fetched, downloads ahead on the
        node give this one the link."""
        fs, root = self.filesystem()
        if self.on_node(info):
            return self.cache.pin(fs, root, info)
        self.cache._own_folder()  # made (private, marked) by the cache: the demand marks live there
        with self.demand.waiting(info.file):
            return self.cache.pin(fs, root, info)

    def unpin(self, info: ShardInfo) -> None:
        self.cache.unpin(info.file)

    # -- downloads ahead --------------------------------------------------------------------------

    def _fetch(self, shard: int) -> None:
        fs, root = self.filesystem()
        info = self.manifest.shards[shard]
        if self.on_node(info):
            return
        if not self.board.worth_fetching(info.file, info.bytes, self.cache._entries(), self.cache.max_bytes):
            return  # it would push out copies needed before it: the read that needs it fetches it
        self.cache.fetch(Background(fs, self.demand, info.file), root, info)

    def fetcher(self, shard_offsets) -> ShardFetcher:
        if self._fetcher is None:
            # a quarter of this rank's share of the node cache ahead, whatever the shard size
            share = self.cache.max_bytes // (4 * local_world_size())
            ahead = max(1, min(256, share // max(1, self.largest)))
            self.cache._own_folder()  # the plan board lives there
            self._fetcher = ShardFetcher(
                self._fetch,
                shard_offsets,
                ahead=ahead,
                concurrency=8,
                on_plan=self.board.publish,
                on_advance=self.board.advance,
            )
        return self._fetcher
