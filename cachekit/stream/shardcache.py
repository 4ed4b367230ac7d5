"""One node-local copy of a remote cache's shards, shared by every rank and worker on the node, within a byte limit.

A shard of a cache on object storage is downloaded once per node: the first process to need it
takes the shard's download lock exclusively (``flock``: released by the kernel if the process
dies), fetches the shard in parallel ranged GETs into a hidden ``.part`` file, checks size and
sha256 against the manifest and renames it into place; every other process waiting on that lock
then finds it there. A partial download is never used: only a verified, renamed file counts, and
a copy is checked again before each reuse (``copies``: cheaply while nothing about it changed,
else hashed in full), and fetched again when it does not hold the manifest's bytes.

The folder is private (``store.private``): by default ``$XDG_CACHE_HOME/cachekit/shards`` (else
``~/.cache/cachekit/shards``), made mode 0700; a folder owned by another user or writable by
others is refused. Every file made there (locks, markers, the log, downloads) is opened without
following links, and whole files are renamed into place.

Readers *pin* the shards they have open (a shared lock on the shard's pin lock, a second file: a
process waiting for a download never waits for the downloader's pin). To stay within
``max_bytes``, the least recently used shards that no process pins are deleted (an exclusive,
non-blocking lock proves nobody holds one open: no memory map keeps deleted bytes alive). So the
disk holds at most the limit plus the one shard being fetched; a limit smaller than a shard is an
error at once. Leftovers of crashed downloads are removed by the next process that makes room.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from pathlib import Path

from ..constants import env_int
from ..errors import CacheError, CachekitError, UsageError
from ..store.atomic import fsync_dir, path_size, remove_path, sha256_path
from ..store.manifest import ShardInfo
from ..store.private import append_line, open_nofollow, private_folder, read_nofollow
from ..store.remote import fetch_shard, shard_objects
from .copies import forget_copy, record_verified, verified_copy
from .nodefolder import (
    DEFAULT_LOCAL_CACHE_BYTES,
    MARKER,
    byte_limit,
    default_cache_folder,
    mark_folder,
    open_lock,
)

__all__ = ["NodeShardCache", "DEFAULT_LOCAL_CACHE_BYTES", "default_cache_folder", "byte_limit"]

#: How long a download waits for pinned shards to be let go before the limit is declared too small.
_WAIT_FOR_ROOM_S = env_int("CACHEKIT_LOCAL_CACHE_WAIT", 300)
_LOG = ".downloads.log"
_LOG_BYTES = 1 << 20


def _lock(fd: int, kind: int, wait: bool = True) -> bool:
    try:
        fcntl.flock(fd, kind | (0 if wait else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False


class NodeShardCache:
    """The node-local copies of one remote cache's shards (``fingerprint`` names its folder)."""

    #: ``entries -> entries`` in the order to evict (``stream.eviction``); None: least recently used first.
    eviction_order = None

    def __init__(
        self, folder: str | os.PathLike | None, max_bytes: int | None, fingerprint: str, largest_shard: int
    ) -> None:
        self.root = Path(folder) if folder else default_cache_folder()
        self.folder = self.root / fingerprint[:24]
        self.max_bytes = byte_limit(max_bytes)
        if largest_shard > self.max_bytes:
            raise UsageError(
                f"local_cache_bytes={self.max_bytes} is smaller than the cache's largest shard "
                f"({largest_shard} bytes): it could not hold even one"
            )
        self._pins: dict[str, tuple[int, int]] = {}  # shard file -> (lock fd, pins in this process)
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        private_folder(self.root, "local_cache")  # refused at once, before any download

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_pins"], state["_mutex"] = {}, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._mutex = threading.Lock()

    def _fresh_process(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's locks are the parent's
            self._pins, self._mutex, self._pid = {}, threading.Lock(), os.getpid()

    def _own_folder(self) -> None:
        """This cache's folder (private, made again if a cleaner removed it), marked as the node
        cache's own: eviction looks in marked folders only, so a ``local_cache`` that also holds
        other files (``/scratch``) never loses them. A marker that is not a plain file (a link,
        dangling or not) is replaced, never written through."""
        private_folder(self.root, "local_cache")
        private_folder(self.folder, "local_cache")
        mark_folder(self.folder)

    def _lock_fd(self, name: str) -> int:
        self._own_folder()
        return open_lock(self.folder / f".{name}.lock")

    def path(self, info: ShardInfo) -> Path:
        return self.folder / info.file

    def _complete(self, info: ShardInfo, rehash: bool = False) -> bool:
        """The copy of ``info`` holds the manifest's bytes: by its record, or (``rehash``) in full."""
        return verified_copy(self.path(info), info.bytes, info.sha256, rehash=rehash)

    # -- pins ---------------------------------------------------------------------------------

    def pin(self, fs, remote_root: str, info: ShardInfo) -> Path:
        """The local copy of ``info``, downloaded if no process on the node has it, pinned until ``unpin``."""
        self._fresh_process()
        with self._mutex:
            held = self._pins.get(info.file)
            if held is not None:
                self._pins[info.file] = (held[0], held[1] + 1)
                return self.path(info)
        fd = self._ensure(fs, remote_root, info, keep_shared=True)
        with self._mutex:
            held = self._pins.get(info.file)
            if held is not None:  # another thread pinned it meanwhile: one lock per process is enough
                os.close(fd)
                self._pins[info.file] = (held[0], held[1] + 1)
            else:
                self._pins[info.file] = (fd, 1)
        return self.path(info)

    def unpin(self, name: str) -> None:
        with self._mutex:
            held = self._pins.get(name)
            if held is None:
                return
            fd, count = held
            if count > 1:
                self._pins[name] = (fd, count - 1)
                return
            del self._pins[name]
        os.close(fd)  # releases the shared lock

    def fetch(self, fs, remote_root: str, info: ShardInfo) -> None:
        """Make sure the node has shard ``info`` (downloading ahead of need), without pinning it."""
        self._fresh_process()
        os.close(self._ensure(fs, remote_root, info, keep_shared=False))

    # -- downloads ------------------------------------------------------------------------------

    def _ensure(self, fs, remote_root: str, info: ShardInfo, keep_shared: bool) -> int:
        """The shard's pin lock, held shared, once the shard is complete on the node.

        Downloads of one shard are serialised by a second lock file: waiting for another
        process's download must never wait for its *pin* too (a process that downloaded a shard
        keeps it pinned while its reader is open, which may be for the rest of the epoch).
        The shared pin is taken first and held through the download, so nobody evicts the shard
        (or its partial download) meanwhile.
        """
        fd = self._lock_fd(info.file)
        try:
            _lock(fd, fcntl.LOCK_SH)  # waits only for an eviction of this shard in progress
            if not self._complete(info):
                self._download_once(fs, remote_root, info, pinning=keep_shared)
            os.utime(fd)  # most recently used: the lock's time, so the copy's own stamp stays as verified
            if not keep_shared:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _download_once(self, fs, remote_root: str, info: ShardInfo, pinning: bool = False) -> None:
        """Download ``info`` unless another process of the node did while this one waited, or the
        copy there holds the manifest's bytes after all (hashed in full: its record was stale)."""
        guard = open_lock(self.folder / f".{info.file}.download.lock")
        try:
            _lock(guard, fcntl.LOCK_EX)  # one process downloads; the others wait here, then find it
            if not self._complete(info, rehash=True):
                forget_copy(self.path(info))
                remove_path(self.path(info))  # a wrong copy is never served, nor counted
                part = self.folder / f".{info.file}.{os.getpid()}.{threading.get_ident()}.part"
                self._make_room(info.bytes, info.file, part, pinning)
                self._download(fs, f"{remote_root}/{info.file}", info, part)
        finally:
            os.close(guard)

    def _download(self, fs, remote: str, info: ShardInfo, part: Path) -> None:
        try:
            self._fetch_verified(fs, remote, info, part)
        except BaseException:
            remove_path(part)
            raise
        final = self.path(info)
        remove_path(final)
        os.replace(part, final)
        fsync_dir(self.folder)
        try:
            record_verified(final, info.sha256)  # stamped as renamed: later reuse is checked against it
        except OSError:
            forget_copy(final)  # no record (a full disk): the next reuse hashes the copy in full
        try:  # one line per download: what the node fetched (the last ~1 MB)
            append_line(self.folder / _LOG, f"{info.file} {info.bytes} {os.getpid()}\n", _LOG_BYTES)
        except OSError:
            pass  # a log that cannot be written never fails a read

    def _fetch_verified(self, fs, remote: str, info: ShardInfo, part: Path) -> None:
        """Fetch ``remote`` into ``part``, checked against the manifest's size and sha256."""
        try:
            objects = shard_objects(fs, remote)
        except FileNotFoundError:
            raise CacheError(f"{remote}: shard is missing") from None
        except OSError as exc:
            raise CacheError(f"{remote}: cannot be fetched ({exc})") from None
        stored = sum(size for _, size in objects)
        if stored != info.bytes:  # refused before a byte is fetched: the limit holds
            raise CacheError(
                f"{remote}: the object holds {stored} bytes, the manifest says {info.bytes}: the cache "
                "was changed on storage after it was built; rebuild it or restore the shard"
            )
        try:
            fetch_shard(fs, remote, part, objects)  # a folder shard replaces the reservation file
        except CachekitError:
            raise
        except FileNotFoundError as exc:
            if exc.filename is not None and str(exc.filename).startswith(str(self.root)):
                raise CacheError(
                    f"{self.folder}: the local copy of {info.file} vanished while it was fetched "
                    "(was the local_cache folder removed?)"
                ) from None
            raise CacheError(f"{remote}: shard is missing") from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise CacheError(f"{self.folder}: disk full while fetching {info.file}") from None
            raise CacheError(f"{remote}: cannot be fetched ({exc})") from None
        if path_size(part) != info.bytes or sha256_path(part) != info.sha256:
            raise CacheError(f"{remote}: fetched bytes do not match the manifest's size and sha256")

    def downloads(self) -> list[str]:
        """Shard files this node has downloaded, once per download (``.downloads.log``)."""
        text = read_nofollow(self.folder / _LOG, 4 * _LOG_BYTES) or b""
        return [line.split()[0] for line in text.decode(errors="replace").splitlines() if line.strip()]

    # -- the byte limit ---------------------------------------------------------------------------

    def _entries(self) -> list[tuple[float, int, Path, Path | None]]:
        """(last use, bytes, path, lock path) of every shard copy and partial download in the root's
        marked folders (those this class made); nothing else there is counted or touched. A copy's
        last use is its pin lock's time (``_ensure`` touches it), else the copy's own."""
        found = []
        subs = []
        for p in self.root.iterdir():
            try:
                if stat.S_ISDIR(os.lstat(p).st_mode) and stat.S_ISREG(os.lstat(p / MARKER).st_mode):
                    subs.append(p)
            except OSError:
                continue
        for sub in subs:
            for entry in sub.iterdir():
                name = entry.name
                if name.endswith(".lock") or name in (_LOG, MARKER) or entry.is_symlink():
                    continue
                if not (name.startswith("shard-") or (name.startswith(".shard-") and name.endswith(".part"))):
                    continue  # not a shard copy: left alone
                if name.startswith(".") and name.endswith(".part"):
                    lock = sub / f".{name[1:].rsplit('.', 3)[0]}.lock"
                else:
                    lock = sub / f".{name}.lock"
                try:
                    size, mtime = path_size(entry), entry.stat().st_mtime
                except OSError:
                    continue
                if not name.startswith("."):
                    try:
                        mtime = max(mtime, os.lstat(lock).st_mtime)
                    except OSError:
                        pass
                found.append((mtime, size, entry, lock))
        return sorted(found, key=lambda t: t[0])

    def _own_pinned_bytes(self, keep: str) -> int:
        """Bytes of the copies this object holds pinned, ``keep`` aside (a thread waiting for room
        holds the reader pool's lock: none of them can be let go before it is done)."""
        with self._mutex:
            names = [name for name in self._pins if name != keep]
        total = 0
        for name in names:
            try:
                total += path_size(self.folder / name)
            except OSError:
                continue
        return total

    def _make_room(self, need: int, keep: str, reserve: Path, pinning: bool = False) -> None:
        """Delete unpinned copies, least recently used first, until ``need`` more bytes fit, then
        reserve them: ``reserve`` (the download's ``.part``) is made at full size under the same
        lock, so downloads of other processes count it. When the copies this process itself holds
        pinned (``pinning``: for a reader) leave no room, waiting could never end: refused at once."""
        deadline = time.monotonic() + _WAIT_FOR_ROOM_S
        while True:
            self._own_folder()  # again: a temp cleaner may have removed it meanwhile
            guard = open_lock(self.root / ".evict.lock")
            try:
                fcntl.flock(guard, fcntl.LOCK_EX)
                for stale in self.folder.glob(
                    f".{keep}.*.part"
                ):  # a crashed download's: we hold its download lock
                    remove_path(stale)
                total = self._evict(need, keep)
                if total <= self.max_bytes:  # at most the limit plus this one shard on disk
                    fd = open_nofollow(reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                    try:
                        os.ftruncate(fd, need)
                    finally:
                        os.close(fd)
                    return
            finally:
                os.close(guard)
            own = self._own_pinned_bytes(keep) if pinning else 0
            if own and own + need > self.max_bytes:
                with self._mutex:
                    count = len(self._pins)
                raise CacheError(
                    f"local_cache_bytes={self.max_bytes} cannot hold the {count} shards this process has "
                    f"open at once ({own} bytes) and {keep} ({need} bytes) too: one read (a read_batch, "
                    "a batch) needs more shards than the node cache holds; read indices from fewer shards "
                    "at once, or raise local_cache_bytes"
                )
            if time.monotonic() > deadline:
                raise CacheError(
                    f"local shard cache {self.root} holds {total} bytes of shards in use, over its "
                    f"{self.max_bytes}-byte limit, and none was let go for {_WAIT_FOR_ROOM_S} s: every "
                    "reading process (ranks x workers) pins the shards of its current batch; raise "
                    "local_cache_bytes, or build the cache with smaller shards"
                )
            time.sleep(0.2)  # wait for other processes to let go of their shards

    def _evict(self, need: int, keep: str) -> int:
        entries = self._entries()
        if self.eviction_order is not None:
            entries = self.eviction_order(entries)
        total = sum(size for _, size, _, _ in entries)
        for _, size, path, lock_path in entries:
            if total + need <= self.max_bytes:
                break
            if path.name == keep or lock_path is None:
                continue
            try:
                fd = open_lock(lock_path)
            except CacheError:
                continue
            try:
                if not _lock(fd, fcntl.LOCK_EX, wait=False):
                    continue  # pinned by a reader, or being downloaded
                remove_path(path)
                forget_copy(path)
                total -= size
            finally:
                os.close(fd)
        return total
