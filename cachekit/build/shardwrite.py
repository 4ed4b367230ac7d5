"""Committing one shard: refused before writing when it cannot fit, and any failure one line.

A shard is written under a temp name and renamed into place (``Location.commit``). libhdf5 may
crash on a full disk and torch reports a short write as "unexpected pos", so the free space is
checked before an uncompressed shard is written and again when a backend fails.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np

from ..constants import MANIFEST_NAME, PARTIAL_DIR
from ..errors import BuildError, UsageError
from ..store.formats import get_format
from ..store.location import LocalLocation, Location, open_location, write_failure
from ..store.manifest import ShardInfo
from ..store.remote import is_url
from .retire import read_retired, recorded_names, recorded_shards

__all__ = ["commit_shard", "check_at_out", "disk_full", "remove_written"]


def _check_space(out, file: str, fmt, arrays: dict[str, np.ndarray], options: dict) -> None:
    """Refuse to start writing a shard that cannot fit.

    A compressed shard's size is not known in advance, so its write reports a full disk itself,
    unless its library may crash the process when the disk fills (``fmt.crashes_when_disk_fills``,
    libhdf5): such a shard needs room for its uncompressed size (compression rarely enlarges it).
    """
    if not isinstance(out, LocalLocation):
        return
    compressed = options.get("compression", "none") != "none"
    if compressed and not fmt.crashes_when_disk_fills:
        return
    need = sum(a.nbytes for a in arrays.values()) + (256 << 10)
    try:
        free = shutil.disk_usage(out.path).free
    except OSError:
        return
    if free < need:
        why = (
            f"; a compressed {fmt.name} shard needs room for its uncompressed size while it is "
            "written, since its library can crash when the disk fills mid-write"
            if compressed
            else ""
        )
        raise BuildError(
            f"cannot write shard {out.url}/{file}: disk full ({free / 1e6:.1f} MB free, "
            f"the shard needs {need / 1e6:.1f} MB{why})"
        )


def _says_disk_full(exc: BaseException) -> bool:
    """The error is a full disk, by its errno or, for libraries that wrap it (HDF5), its text, or
    the error it was raised from (torch's "unexpected pos" comes with the file's ENOSPC as its
    context): another worker's failed shard may have freed the space by the time anyone looks."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        text = str(exc)
        if "No space left on device" in text or "errno = 28" in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full(out) -> bool:
    """True when the filesystem of a local ``out`` has less than 1 MiB free."""
    if not isinstance(out, LocalLocation):
        return False
    try:
        return shutil.disk_usage(out.path).free < (1 << 20)
    except OSError:
        return False


def commit_shard(
    out_url: str,
    file: str,
    format_name: str,
    arrays: dict[str, np.ndarray],
    options: dict,
    storage_options: dict | None = None,
) -> tuple[int, str]:
    """Write a shard under a temp name and rename it into ``out_url``; returns (bytes, sha256).

    An ``out_url`` on object storage is reached with ``storage_options``. Any failure is one
    BuildError line ("disk full" when it is), whatever the backend raised.
    """
    out = open_location(out_url, storage_options)
    fmt = get_format(format_name)
    _check_space(out, file, fmt, arrays, options)

    def write(tmp: Path) -> None:
        try:
            fmt.write(tmp, arrays, options)
        except Exception as exc:  # torch says "unexpected pos", HDF5 "file write failed ... errno = 28"
            if _says_disk_full(exc) or disk_full(out):  # checked while the temp file takes up the space
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from exc
            raise

    try:
        return out.commit(file, write)
    except (BuildError, UsageError):
        raise
    except Exception as exc:  # OSError, and the backends' own wrappers (torch's RuntimeError, ...)
        full = _says_disk_full(exc) or disk_full(out)
        reason = "disk full" if full else write_failure(exc)
        raise BuildError(f"cannot write shard {out.url}/{file}: {reason}") from None


def remove_written(out: str, names: list[str], storage_options: dict | None = None) -> list[str]:
    """On a worker of a failed build: remove the shards ``names`` this build wrote at ``out`` as
    this machine sees it, unless ``out`` is the build's own folder (shared storage: its records,
    ``.cachekit-partial``, are there and keep them for a resume) or a cache there references them.

    A local ``--out`` that the workers do not share with the build's client is each worker's own
    folder: nothing else would ever remove what the build wrote there. Returns the names removed.
    """
    if is_url(out):
        return []  # object storage is one store for every worker and the client
    location = open_location(out, storage_options)
    if location.read_text(f"{PARTIAL_DIR}/state.json") is not None:
        return []
    keep = recorded_shards(location.read_text(MANIFEST_NAME)) | set(read_retired(location))
    removed = []
    for name in recorded_names(names, f"{out} (shards of a failed build)"):
        if name not in keep and location.size(name) is not None:
            location.remove(name)
            removed.append(name)
    return removed


def check_at_out(out: Location, shards: list[ShardInfo], executor: str) -> None:
    """Every shard the manifest will name is at ``--out`` with its recorded size, or one clear error."""
    for info in shards:
        size = out.size(info.file)
        if size != info.bytes:
            found = "missing" if size is None else f"{size} bytes, not {info.bytes}"
            if executor == "dask":
                raise BuildError(
                    f"shard {info.file} is not at {out.url} ({found}): --out must be storage that every "
                    "worker and this process share, or a URL"
                )
            raise BuildError(
                f"shard {info.file} is not at {out.url} ({found}); was it changed during the build?"
            )
