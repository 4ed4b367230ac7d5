"""Where a cache lives: a local folder, or a folder on object storage (an fsspec URL).

``read_manifest`` reads either. A build writes through a ``Location``: both kinds give it the same
few operations, each all-or-nothing for a reader of the location: a
local file is written under a temp name and renamed; an object is uploaded whole (object stores
never show half an upload). The manifest is still written last, so a cache is valid iff its
manifest is there and validates.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..constants import MANIFEST_NAME
from ..errors import BuildError, CacheError, NotACacheError, UsageError
from .atomic import commit_file, path_size, remove_path, sha256_path
from .index import INDEX_NAME, ShardIndex, index_record, write_index
from .lock import BuildLock
from .manifest import Manifest
from .manifestio import manifest_text, parse_manifest, read_local_manifest
from .remote import access_error, answered_within, filesystem, is_url, process_filesystem, reach
from .remoteindex import fetch_index

__all__ = [
    "Location",
    "LocalLocation",
    "RemoteLocation",
    "open_location",
    "read_manifest",
    "write_failure",
    "commit_index",
    "write_manifest",
]

_CHUNK = 4 * 1024 * 1024


def write_failure(exc: BaseException) -> str:
    """Why a write failed, in words: "disk full" for ENOSPC (and a quota), else the OS's message."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk full" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return " ".join(str(exc).split())[:200] or type(exc).__name__


class Location:
    """The operations a build needs on its output folder; ``name`` may be ``"sub/name"``."""

    url: str

    def names(self, sub: str = "") -> list[str]: ...
    def exists(self) -> bool: ...
    def mkdir(self, sub: str = "") -> None: ...
    def size(self, name: str) -> int | None: ...
    def sha256(self, name: str) -> str: ...
    def read_text(self, name: str) -> str | None: ...
    def write_text(self, name: str, text: str) -> None: ...
    def commit(self, name: str, write: Callable[[Path], None]) -> tuple[int, str]: ...
    def remove(self, name: str) -> None: ...
    def lock(self): ...
    def open_index(self, record: dict) -> ShardIndex: ...


class LocalLocation(Location):
    """A local folder. Entries inside it are never reached through a link: a name whose folder
    (``.cachekit-partial`` in ``.cachekit-partial/state.json``) is a link counts as absent, and a
    shard name that is a link has no size or checksum, so nothing outside the folder is read,
    written or removed on a record's word."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.url = str(self.path)

    def _linked(self, name: str, itself: bool = False) -> bool:
        """True when a folder on the way to ``name`` (or, with ``itself``, ``name``) is a link."""
        parts = [p for p in name.split("/") if p]
        current = self.path
        for part in parts if itself else parts[:-1]:
            current = current / part
            if current.is_symlink():
                return True
        return False

    def names(self, sub: str = "") -> list[str]:
        folder = self.path / sub
        if self._linked(sub, itself=True):
            return []
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def exists(self) -> bool:
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--out {self.path} exists and is not a folder")
        return self.path.is_dir()

    def mkdir(self, sub: str = "") -> None:
        try:
            if sub and self._linked(sub, itself=True):
                (self.path / sub).unlink()  # a link in the place of cachekit's own folder: the entry goes
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BuildError(f"cannot create {self.path / sub}: {write_failure(exc)}") from None

    def size(self, name: str) -> int | None:
        if self._linked(name, itself=True):
            return None
        try:
            return path_size(self.path / name)
        except OSError:
            return None

    def sha256(self, name: str) -> str:
        if self._linked(name, itself=True):
            raise OSError(errno.ELOOP, "is a link", str(self.path / name))
        return sha256_path(self.path / name)

    def read_text(self, name: str) -> str | None:
        if self._linked(name, itself=True):
            return None
        try:
            return (self.path / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def write_text(self, name: str, text: str) -> None:
        try:
            if self._linked(name):
                raise OSError(errno.ELOOP, "a folder on the way is a link")
            commit_file(self.path / name, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        except OSError as exc:
            raise BuildError(f"cannot write {self.path / name}: {write_failure(exc)}") from None

    def commit(self, name: str, write: Callable[[Path], None]) -> tuple[int, str]:
        return commit_file(self.path / name, write)

    def remove(self, name: str) -> None:
        target = self.path / name
        if not self._linked(name) and not target.is_symlink():
            remove_path(target)

    def lock(self):
        return BuildLock(self.path)

    def open_index(self, record: dict) -> ShardIndex:
        if self._linked(record["file"], itself=True):
            raise CacheError(f"{self.path / record['file']}: the shard index is a link")
        return ShardIndex(self.path / record["file"], record)


class RemoteLocation(Location):
    """A folder on object storage. There is no lock: one build at a time is the caller's to ensure.

    ``storage_options`` configure its filesystem (made once per process, see
    ``remote.process_filesystem``) and are never written anywhere. A failed call is one line:
    UsageError for refused options or credentials, else BuildError.
    """

    def __init__(self, url: str, storage_options: dict | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = process_filesystem(self.url, self.storage_options)

    def __repr__(self) -> str:  # never the options: they may hold a secret
        return f"RemoteLocation({self.url!r})"

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    @contextlib.contextmanager
    def _calling(self, name: str = "", doing: str = "reach"):
        """Any failure of the filesystem but "not found" as one CachekitError naming the object."""
        try:
            yield
        except FileNotFoundError:
            raise
        except Exception as exc:
            where = f"{self.url}/{name}" if name else self.url
            raise access_error(where, exc, BuildError, doing) from None

    def names(self, sub: str = "") -> list[str]:
        try:
            with self._calling(sub, "list"):
                return sorted(Path(p.rstrip("/")).name for p in self.fs.ls(self._path(sub), detail=False))
        except FileNotFoundError:
            return []

    def exists(self) -> bool:
        reach(self.fs, self.root, self.url)  # an unreachable endpoint: one line, not minutes of retries
        return bool(self.names())

    def mkdir(self, sub: str = "") -> None:
        pass  # object stores have no folders to make

    def size(self, name: str) -> int | None:
        path = self._path(name)
        try:
            with self._calling(name):
                if self.fs.isdir(path):
                    return sum(self.fs.du(path, total=False).values())
                return int(self.fs.size(path))
        except FileNotFoundError:
            return None

    def sha256(self, name: str) -> str:
        """The same digest as ``atomic.sha256_path`` gives the local file or folder."""
        path = self._path(name)
        with self._calling(name, "read"):
            if not self.fs.isdir(path):
                return self._hash_object(path, hashlib.sha256()).hexdigest()
            h = hashlib.sha256()
            for f in sorted(self.fs.find(path)):
                rel = f[len(path) :].lstrip("/")
                h.update(f"{rel}\0{self.fs.size(f)}\n".encode())
                self._hash_object(f, h)
            return h.hexdigest()

    def _hash_object(self, path: str, h):
        with self.fs.open(path, "rb") as fh:
            while block := fh.read(_CHUNK):
                h.update(block)
        return h

    def read_text(self, name: str) -> str | None:
        try:
            with self._calling(name, "read"):
                return self.fs.cat_file(self._path(name)).decode("utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def write_text(self, name: str, text: str) -> None:
        with self._calling(name, "write"):
            self.fs.pipe_file(self._path(name), text.encode("utf-8"))

    def commit(self, name: str, write: Callable[[Path], None]) -> tuple[int, str]:
        """Write locally, then upload: each object appears whole, or not at all."""
        with tempfile.TemporaryDirectory(prefix="cachekit-upload-") as tmpdir:
            local = Path(tmpdir) / name
            write(local)
            size, digest = path_size(local), sha256_path(local)
            try:
                with self._calling(name, "upload"):
                    if local.is_dir():
                        self.fs.put(str(local) + "/", self._path(name), recursive=True)
                    else:
                        self.fs.put_file(str(local), self._path(name))
            except FileNotFoundError as exc:  # the bucket is not there
                raise BuildError(f"cannot upload {self.url}/{name}: {exc.strerror or exc}") from None
        return size, digest

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError), self._calling(name, "remove"):
            self.fs.rm(self._path(name), recursive=True)

    def lock(self):
        return contextlib.nullcontext()

    def open_index(self, record: dict) -> ShardIndex:
        return fetch_index(self.fs, self.root, self.url, record)


def commit_index(out: Location, manifest: Manifest) -> Manifest:
    """Write the binary index of ``manifest``'s shards into ``out`` (before the manifest, which names
    it): named by its content, so a reader that maps it later maps the one its manifest names.
    Returns the manifest with the index's record, ready to be written."""
    with tempfile.TemporaryDirectory(prefix="cachekit-index-") as tmpdir:
        local = Path(tmpdir) / "index.bin"
        write_index(local, manifest.shards, manifest.sample.shape[0])
        digest = sha256_path(local)
        name = INDEX_NAME.format(digest=digest[:16])
        try:
            size, _ = out.commit(name, lambda tmp: shutil.copyfile(local, tmp))
        except OSError as exc:
            raise BuildError(f"cannot write {out.url}/{name}: {write_failure(exc)}") from None
    record = index_record(name, size, digest, len(manifest.shards), manifest.num_samples)
    return replace(manifest, index=record)


def write_manifest(cache_dir: str | os.PathLike, manifest: Manifest) -> Path:
    """Write a local cache's manifest atomically, after a format 5 cache's index (which it names)."""
    out = LocalLocation(cache_dir)
    if manifest.format_version >= 5 and not manifest.index:
        manifest = commit_index(out, manifest)
    data = manifest_text(manifest)
    out.commit(MANIFEST_NAME, lambda tmp: tmp.write_text(data, encoding="utf-8"))
    return out.path / MANIFEST_NAME


def open_location(out: str | os.PathLike, storage_options: dict | None = None) -> Location:
    """The build output at ``out``: a local folder, or an fsspec URL (``storage_options`` for its filesystem)."""
    return RemoteLocation(str(out), storage_options) if is_url(out) else LocalLocation(out)


def read_manifest(
    cache: str | os.PathLike,
    *,
    storage_options: dict | None = None,
    index_folder=None,
) -> Manifest:
    """Read and validate the manifest of the cache at ``cache``: a folder, or an fsspec URL
    (``storage_options`` for its filesystem). Every problem is a CacheError saying what is wrong.

    A format 5 cache's shard index is mapped, not parsed: from the folder, or for a URL fetched
    once into ``index_folder.folder(fingerprint)`` (a node's folder of copies, whose records say
    when a copy there may be reused: ``stream.remotecache.NodeIndexCopies``; default: a temporary
    file).
    """
    if not is_url(cache):
        return read_local_manifest(cache)
    url = str(cache).rstrip("/")
    fs, root = filesystem(url, storage_options)
    try:
        text = answered_within(lambda: fs.cat_file(f"{root}/{MANIFEST_NAME}"), url).decode("utf-8")
    except FileNotFoundError:
        raise NotACacheError(
            f"{url}: no {MANIFEST_NAME} (not a cache, or its build has not finished)"
        ) from None
    except UnicodeDecodeError as exc:
        raise CacheError(f"{url}/{MANIFEST_NAME}: cannot be read: {exc}") from None
    except Exception as exc:  # the filesystem's own errors: credentials, endpoint, I/O
        raise access_error(f"{url}/{MANIFEST_NAME}", exc, CacheError) from None
    where = f"{url}/{MANIFEST_NAME}"

    def open_index(record: dict) -> ShardIndex:
        fingerprint = _fingerprint_of(text) if index_folder is not None else None
        if fingerprint is None:
            return fetch_index(fs, root, url, record)
        return fetch_index(fs, root, url, record, index_folder.folder(fingerprint), index_folder)

    return parse_manifest(text, where, open_index)


def _fingerprint_of(text: str) -> str | None:
    """The manifest's fingerprint, read before the manifest is validated (names the node's folder)."""
    try:
        value = json.loads(text).get("fingerprint")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16,128}", value) else None
