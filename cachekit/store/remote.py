"""Object storage transport (``s3://``, ``gs://``, ``memory://`` ... through fsspec).

How to reach a URL: which filesystem serves it (with an install hint when its package is
missing), one filesystem per process, and its failures in one line. What is read or written
there is the business of ``location`` (caches) and of the feed's shard cache; the storage options
that configure it are ``storageopts``'s. Credentials come from storage options or the usual
fsspec/boto environment, never from a cache.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ..constants import REMOTE_REPLY_SECONDS
from ..errors import CacheError, CachekitError, UsageError
from .atomic import remove_path
from .private import NOFOLLOW
from .storageopts import check_endpoints, parse_storage_options, redact, secrets_hidden

__all__ = [
    "is_url",
    "is_object_store",
    "filesystem",
    "process_filesystem",
    "access_error",
    "answered_within",
    "reach",
    "shard_objects",
    "fetch_shard",
    "ranged_get",
    "parse_storage_options",
    "redact",
    "secrets_hidden",
]


def is_url(path: str | os.PathLike) -> bool:
    """True for ``scheme://...`` locations (``file://`` included), False for plain paths."""
    return "://" in str(path)


def is_object_store(path: str | os.PathLike) -> bool:
    """True for a URL served by something other than the local filesystem (not ``file://``)."""
    return is_url(path) and not str(path).startswith(("file://", "local://"))


def filesystem(url: str, storage_options: dict | None = None, *, fresh: bool = False):
    """``(fsspec filesystem, path inside it)`` for ``url``, with an install hint when it is missing.

    ``storage_options`` go to the filesystem (``endpoint_url``, ``key``, ``anon``, ...), never into a
    cache or a log. ``fresh``: a new instance rather than fsspec's cached one; a process must not use
    an instance made before it was forked (s3fs's event loop and sessions are not fork-safe).
    """
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise UsageError(f"{url}: remote caches need fsspec: pip install 'cachekit-vision[remote]'") from None
    options = dict(storage_options or {})
    check_endpoints(options, "storage option")
    if options.get("asynchronous"):
        raise UsageError(
            f"{url}: storage option asynchronous=true cannot work here: cachekit calls the filesystem synchronously"
        )
    if fresh:
        options["skip_instance_cache"] = True
    try:
        fs, path = url_to_fs(url, **options)
    except ImportError as exc:
        raise UsageError(f"{url}: {exc} (for s3:// pip install 'cachekit-vision[remote]')") from None
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{url}: bad storage options: {redact(str(exc), storage_options)}") from None
    except Exception as exc:  # filesystems that connect when made (ftp, sftp, ...): one line
        raise access_error(url, exc, UsageError, "connect") from None
    return fs, path.rstrip("/")


_MADE: dict[tuple[str, str], tuple] = {}
_MADE_PID = os.getpid()


def process_filesystem(url: str, storage_options: dict | None = None):
    """``filesystem(url, storage_options)`` made in this process, and reused by later calls in it.

    What a build's worker processes use: the first call in a process makes a fresh instance (never
    one inherited through fork or unpickled), later jobs in that process share it (one session, one
    credential lookup per process, not per shard).
    """
    global _MADE_PID
    if _MADE_PID != os.getpid():  # forked: the parent's instances are not ours to use
        _MADE.clear()
        _MADE_PID = os.getpid()
    key = (url, json.dumps(storage_options or {}, sort_keys=True, default=repr))
    made = _MADE.get(key)
    if made is None:
        made = _MADE[key] = filesystem(url, storage_options, fresh=True)
    return made


def access_error(
    url: str, exc: BaseException, fallback: type[CachekitError], doing: str = ""
) -> CachekitError:
    """One line for a failed call to the filesystem serving ``url``.

    Storage options it refused, missing or refused credentials and an endpoint it cannot reach are
    the user's to fix (UsageError, exit 2); anything else is ``fallback`` (CacheError when reading
    a cache, BuildError when writing one), saying "cannot ``doing``" when given.
    """
    if isinstance(exc, CachekitError):
        return exc
    name = type(exc).__name__
    said = " ".join(str(exc).split())[:300] or name
    if isinstance(exc, (TypeError, AttributeError)):  # an option of the wrong type or name
        return UsageError(f"{url}: bad storage options: {said}")
    if "Credentials" in name or "Token" in name:
        return UsageError(
            f"{url}: {said} (give --storage-option key=... --storage-option secret=..., "
            "or the usual environment, e.g. AWS_ACCESS_KEY_ID)"
        )
    if isinstance(exc, PermissionError):
        return UsageError(f"{url}: access denied ({said}); check the credentials and the bucket's policy")
    if "EndpointConnection" in name or "ConnectTimeout" in name or isinstance(exc, ConnectionRefusedError):
        return UsageError(f"{url}: {said} (check endpoint_url and the network)")
    if isinstance(exc, OSError) and exc.strerror:
        said = " ".join(exc.strerror.split())[:300]
    return fallback(f"cannot {doing} {url}: {said}" if doing else f"{url}: {said}")


_T = TypeVar("_T")


def answered_within(call: Callable[[], _T], url: str, seconds: float | None = None) -> _T:
    """``call()`` (a first request to the storage at ``url``), given up on in one line when no
    answer comes within ``seconds`` (default ``REMOTE_REPLY_SECONDS``; 0: wait for ever).

    An unreachable endpoint otherwise holds a command for as long as the filesystem's retries last
    (minutes, with a retries storage option). The call goes on in a daemon thread that is left
    behind; its error, when it fails in time, is raised here as it is.
    """
    seconds = REMOTE_REPLY_SECONDS if seconds is None else seconds
    if not seconds or seconds <= 0:
        return call()
    outcome: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="cachekit-first-reply", daemon=True).start()
    if not done.wait(seconds):
        raise UsageError(
            f"{url}: no answer from the storage within {seconds:g} s (check endpoint_url and the "
            "network; CACHEKIT_REMOTE_TIMEOUT sets how long to wait)"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def reach(fs, path: str, url: str) -> None:
    """One cheap request to ``path`` (does it exist?) within the first-reply deadline, its failures
    in one line (UsageError): the storage answers before a long listing starts."""
    try:
        answered_within(lambda: fs.exists(path), url)
    except CachekitError:
        raise
    except Exception as exc:
        raise access_error(url, exc, UsageError, "reach") from None


#: Bytes per ranged GET of a download; several run at once.
_PART = 8 * 1024 * 1024
_PARALLEL = 8


def shard_objects(fs, remote: str) -> list[tuple[str, int]]:
    """``(path, bytes)`` of each object of the shard at ``remote``: the file itself, or every file of
    a folder shard (zarr), sorted. Raises FileNotFoundError when there is none."""
    if fs.isdir(remote):
        return [
            (path, int(meta.get("size") or 0)) for path, meta in sorted(fs.find(remote, detail=True).items())
        ]
    return [(remote, int(fs.info(remote).get("size") or 0))]


def _inside(remote: str, path: str) -> str:
    """The path of object ``path`` inside the folder shard ``remote``: plain names joined by ``/``
    (a listed name such as ``../x`` would lead out of the local copy)."""
    prefix = remote.rstrip("/") + "/"
    rel = path[len(prefix) :] if path.startswith(prefix) else ""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise CacheError(f"{remote}: holds an object named {path!r}, not a plain path inside the shard")
    return rel


def fetch_shard(fs, remote: str, target: Path, objects: list[tuple[str, int]] | None = None) -> None:
    """The shard at ``remote`` (a file, or a folder of files) as ``target``, by ranged GETs of the
    sizes listed in ``objects`` (``shard_objects``, listed here when not given). Every local file is
    created without following links, and a folder shard's objects land inside ``target`` only."""
    objects = shard_objects(fs, remote) if objects is None else objects
    if objects and objects[0][0] == remote:
        ranged_get(fs, remote, target, objects[0][1])
        return
    local = [(path, size, target / _inside(remote, path)) for path, size in objects]
    remove_path(target)  # a folder shard is a folder, whatever stood at ``target`` before
    target.mkdir(parents=True)
    for path, size, dest in local:
        dest.parent.mkdir(parents=True, exist_ok=True)
        ranged_get(fs, path, dest, size)


def ranged_get(fs, remote: str, target: Path, size: int | None = None) -> None:
    """Fetch the object ``remote`` into ``target`` with parallel ranged GETs of ``_PART`` bytes: its
    first ``size`` bytes (default: the object's size), never more. ``target`` is opened once,
    without following a link, and written at each range's offset."""
    size = int(fs.size(remote)) if size is None else int(size)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
        ranges = [(start, min(size, start + _PART)) for start in range(0, size, _PART)]

        def get(bounds: tuple[int, int]) -> None:
            data = fs.cat_file(remote, start=bounds[0], end=bounds[1])
            if len(data) != bounds[1] - bounds[0]:
                raise OSError(f"short read of {remote} at {bounds[0]}")
            view, offset = memoryview(data), bounds[0]
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written

        if len(ranges) <= 1:
            for r in ranges:
                get(r)
        else:
            with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(ranges))) as pool:
                list(pool.map(get, ranges))
        os.fsync(fd)
    finally:
        os.close(fd)
