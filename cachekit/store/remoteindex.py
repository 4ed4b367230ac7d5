"""A cache's shard index on object storage: fetched whole, checked against the manifest's size and
sha256 before it is mapped, and kept in a node's folder of copies (fetched there once, by rename)
or in a temporary file removed once mapped."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ..errors import CacheError
from .atomic import path_size, sha256_path
from .index import ShardIndex
from .remote import access_error

__all__ = ["fetch_index"]


def fetch_index(fs, root: str, url: str, record: dict, folder: Path | None = None, copies=None) -> ShardIndex:
    """The index object of the cache at ``url`` (``fs``, ``root``), fetched whole and checked against
    the manifest's size and sha256, then mapped: kept in ``folder`` (a node's folder of copies,
    shared by its processes: fetched there once, by rename) or, without one, in a temporary file
    removed once mapped (the map keeps its pages). ``copies`` (the node cache's records of checked
    copies: ``verified(path, size, sha256)``, ``record(path, sha256)``) says when a copy already in
    ``folder`` may be mapped without hashing it again; without it a copy is hashed before reuse."""
    remote = f"{root}/{record['file']}"
    if folder is not None:
        final = Path(folder) / record["file"]
        if final.is_file() and not final.is_symlink():
            if copies is not None:
                ok = copies.verified(final, record["bytes"], record["sha256"])
            else:
                ok = path_size(final) == record["bytes"] and sha256_path(final) == record["sha256"]
            if ok:
                return ShardIndex(final, record)
    try:  # one request before the fetch: an object of another size is never downloaded (a disk filled)
        size = fs.size(remote)
    except FileNotFoundError:
        raise CacheError(f"{url}/{record['file']}: the cache's shard index is missing") from None
    except Exception as exc:
        raise access_error(f"{url}/{record['file']}", exc, CacheError) from None
    if size != record["bytes"]:
        raise CacheError(
            f"{url}/{record['file']}: the shard index is {size} bytes, the manifest says {record['bytes']}"
        )
    fd, name = tempfile.mkstemp(prefix=".index-", suffix=".part", dir=folder)
    os.close(fd)
    part = Path(name)
    try:
        try:
            fs.get_file(remote, str(part))
        except FileNotFoundError:
            raise CacheError(f"{url}/{record['file']}: the cache's shard index is missing") from None
        except Exception as exc:
            raise access_error(f"{url}/{record['file']}", exc, CacheError) from None
        if path_size(part) != record["bytes"] or sha256_path(part) != record["sha256"]:
            raise CacheError(
                f"{url}/{record['file']}: fetched bytes do not match the manifest's size and sha256"
            )
        if folder is None:
            return ShardIndex(part, record)  # mapped before the file goes (finally)
        os.replace(part, final)  # whole, by rename: every process of the node maps the same copy
        if copies is not None:
            copies.record(final, record["sha256"])
        return ShardIndex(final, record)
    finally:
        with contextlib.suppress(OSError):
            part.unlink()
