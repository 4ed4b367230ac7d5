"""One node-local copy of a remote cache's shards, shared by every rank and worker on the node, within a byte limit.

A shard of a cache on object storage is downloaded once per node: the first process to need it
takes the shard's download lock exclusively (``flock``: released by the kernel if the process
dies), fetches the shard in parallel ranged GETs into a hidden ``.part`` file, checks size and
sha256 against the manifest and renames it into place; every other process waiting on that lock
then finds it there. A partial download is never used: only a verified, renamed file counts.

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
import tempfile
import threading
import time
from pathlib import Path

from ..constants import env_int
from ..errors import CacheError, UsageError
from ..store.atomic import fsync_dir, path_size, remove_path, sha256_path
from ..store.manifest import ShardInfo
from ..store.remote import fetch_shard, shard_objects

__all__ = ["NodeShardCache", "DEFAULT_LOCAL_CACHE_BYTES", "default_cache_folder"]

#: Default bound of the node's shard cache (bytes); CACHEKIT_LOCAL_CACHE_BYTES overrides it.
DEFAULT_LOCAL_CACHE_BYTES = env_int("CACHEKIT_LOCAL_CACHE_BYTES", 20 * 1024**3)
#: The file that marks a folder of shard copies as this cache's own.
_MARKER = ".cachekit-shards"
#: How long a download waits for pinned shards to be let go before the limit is declared too small.
_WAIT_FOR_ROOM_S = env_int("CACHEKIT_LOCAL_CACHE_WAIT", 300)
_LOG = ".downloads.log"
_LOG_BYTES = 1 << 20


def default_cache_folder() -> Path:
    """``CACHEKIT_LOCAL_CACHE`` or a folder in the temp dir: the same for every process of a user."""
    env = os.environ.get("CACHEKIT_LOCAL_CACHE", "").strip()
    return Path(env) if env else Path(tempfile.gettempdir()) / f"cachekit-shards-{os.getuid()}"


def _lock(fd: int, kind: int, wait: bool = True) -> bool:
    try:
        fcntl.flock(fd, kind | (0 if wait else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False


class NodeShardCache:
    """The node-local copies of one remote cache's shards (``fingerprint`` names its folder)."""

    #: ``entries -> entries`` in the order to evict (``feed.eviction``); None: least recently used first.
    eviction_order = None

    def __init__(
        self, folder: str | os.PathLike | None, max_bytes: int | None, fingerprint: str, largest_shard: int
    ) -> None:
        self.root = Path(folder) if folder else default_cache_folder()
        self.folder = self.root / fingerprint[:24]
        self.max_bytes = DEFAULT_LOCAL_CACHE_BYTES if max_bytes is None else int(max_bytes)
        if self.max_bytes <= 0:
            raise UsageError("local_cache_bytes must be positive")
        if largest_shard > self.max_bytes:
            raise UsageError(
                f"local_cache_bytes={self.max_bytes} is smaller than the cache's largest shard "
                f"({largest_shard} bytes): it could not hold even one"
            )
        self._pins: dict[str, tuple[int, int]] = {}  # shard file -> (lock fd, pins in this process)
        self._mutex = threading.Lock()
        self._pid = os.getpid()

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
        """This cache's folder, marked as the node cache's own: eviction looks in marked folders
        only, so a ``local_cache`` that also holds other files (``/scratch``) never loses them."""
        self.folder.mkdir(parents=True, exist_ok=True)
        marker = self.folder / _MARKER
        if not marker.exists():
            marker.write_text("shard copies of a cachekit cache; removed least recently used first\n")

    def _lock_fd(self, name: str) -> int:
        self._own_folder()
        return os.open(self.folder / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)

    def path(self, info: ShardInfo) -> Path:
        return self.folder / info.file

    def _complete(self, info: ShardInfo) -> bool:
        try:
            return path_size(self.path(info)) == info.bytes
        except OSError:
            return False

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
        os.utime(self.path(info))  # most recently used
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
                self._download_once(fs, remote_root, info)
            if not keep_shared:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _download_once(self, fs, remote_root: str, info: ShardInfo) -> None:
        """Download ``info`` unless another process of the node did while this one waited."""
        guard = os.open(self.folder / f".{info.file}.download.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock(guard, fcntl.LOCK_EX)  # one process downloads; the others wait here, then find it
            if not self._complete(info):
                part = self.folder / f".{info.file}.{os.getpid()}.{threading.get_ident()}.part"
                self._make_room(info.bytes, info.file, part)
                self._download(fs, f"{remote_root}/{info.file}", info, part)
        finally:
            os.close(guard)

    def _download(self, fs, remote: str, info: ShardInfo, part: Path) -> None:
        final = self.path(info)
        try:
            objects = shard_objects(fs, remote)
        except FileNotFoundError:
            remove_path(part)
            raise CacheError(f"{remote}: shard is missing") from None
        except OSError as exc:
            remove_path(part)
            raise CacheError(f"{remote}: cannot be fetched ({exc})") from None
        stored = sum(size for _, size in objects)
        if stored != info.bytes:  # refused before a byte is fetched: the limit holds
            remove_path(part)
            raise CacheError(
                f"{remote}: the object holds {stored} bytes, the manifest says {info.bytes}: the cache "
                "was changed on storage after it was built; rebuild it or restore the shard"
            )
        try:
            fetch_shard(fs, remote, part, objects)  # a folder shard replaces the reservation file
        except FileNotFoundError as exc:
            remove_path(part)
            if exc.filename is not None and str(exc.filename).startswith(str(self.root)):
                raise CacheError(
                    f"{self.folder}: the local copy of {info.file} vanished while it was fetched "
                    "(was the local_cache folder removed?)"
                ) from None
            raise CacheError(f"{remote}: shard is missing") from None
        except OSError as exc:
            remove_path(part)
            if exc.errno == errno.ENOSPC:
                raise CacheError(f"{self.folder}: disk full while fetching {info.file}") from None
            raise CacheError(f"{remote}: cannot be fetched ({exc})") from None
        if path_size(part) != info.bytes or sha256_path(part) != info.sha256:
            remove_path(part)
            raise CacheError(f"{remote}: fetched bytes do not match the manifest's size and sha256")
        remove_path(final)
        os.replace(part, final)
        fsync_dir(self.folder)
        log = self.folder / _LOG  # one line per download: what the node fetched (the last ~1 MB)
        with open(log, "a") as fh:
            fh.write(f"{info.file} {info.bytes} {os.getpid()}\n")
        if log.stat().st_size > _LOG_BYTES:
            lines = log.read_text().splitlines(keepends=True)
            log.write_text("".join(lines[len(lines) // 2 :]))

    def downloads(self) -> list[str]:
        """Shard files this node has downloaded, once per download (``.downloads.log``)."""
        try:
            return [line.split()[0] for line in (self.folder / _LOG).read_text().splitlines() if line]
        except OSError:
            return []

    # -- the byte limit ---------------------------------------------------------------------------

    def _entries(self) -> list[tuple[float, int, Path, Path | None]]:
        """(mtime, bytes, path, lock path) of every shard copy and partial download in the root's
        marked folders (those this class made); nothing else there is counted or touched."""
        found = []
        subs = [
            p for p in self.root.iterdir() if p.is_dir() and not p.is_symlink() and (p / _MARKER).is_file()
        ]
        for sub in subs:
            for entry in sub.iterdir():
                name = entry.name
                if name.endswith(".lock") or name in (_LOG, _MARKER) or entry.is_symlink():
                    continue
                if not (name.startswith("shard-") or (name.startswith(".shard-") and name.endswith(".part"))):
                    continue  # not a shard copy: left alone
                try:
                    size, mtime = path_size(entry), entry.stat().st_mtime
                except OSError:
                    continue
                if name.startswith(".") and name.endswith(".part"):
                    shard = name[1:].rsplit(".", 3)[0]
                    found.append((mtime, size, entry, sub / f".{shard}.lock"))
                elif not name.startswith("."):
                    found.append((mtime, size, entry, sub / f".{name}.lock"))
        return sorted(found, key=lambda t: t[0])

    def _make_room(self, need: int, keep: str, reserve: Path) -> None:
        """Delete unpinned copies, least recently used first, until ``need`` more bytes fit, then
        reserve them: ``reserve`` (the download's ``.part``) is made at full size under the same
        lock, so downloads of other processes count it."""
        deadline = time.monotonic() + _WAIT_FOR_ROOM_S
        while True:
            self._own_folder()  # again: a temp cleaner may have removed it meanwhile
            guard = os.open(self.root / ".evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(guard, fcntl.LOCK_EX)
                for stale in self.folder.glob(
                    f".{keep}.*.part"
                ):  # a crashed download's: we hold its download lock
                    remove_path(stale)
                total = self._evict(need, keep)
                if total <= self.max_bytes:  # at most the limit plus this one shard on disk
                    with open(reserve, "wb") as fh:
                        fh.truncate(need)
                    return
            finally:
                os.close(guard)
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
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                continue
            try:
                if not _lock(fd, fcntl.LOCK_EX, wait=False):
                    continue  # pinned by a reader, or being downloaded
                remove_path(path)
                total -= size
            finally:
                os.close(fd)
        return total
