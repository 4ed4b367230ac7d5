"""The small protocol every storage backend implements: encode a whole shard, decode rows of one."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from ...errors import CacheError
from ..encoding import shaped_store
from ..fields import field_columns
from ..samplespec import SHARD_NAME_COLUMN, SampleSpec
from ..shardfiles import OpenFilesExhausted, out_of_files

__all__ = [
    "ShardFormat",
    "ShardReader",
    "OpenFilesExhausted",
    "check_arrays",
    "check_identity",
    "check_regular_file",
    "identity_column",
    "map_file",
    "out_of_files",
    "prefetch_file",
    "shard_mode",
]


class ShardReader(Protocol):
    """Random access to one shard's rows. Opened lazily, once per process; never pickled open.

    ``image_array``: the images as an ``[N, C, H, W]`` array whose rows are zero-copy views (a
    memory map), or None when rows must be decoded; the dataset copies straight from it.
    """

    image_array: np.ndarray | None

    def __len__(self) -> int: ...

    def images(self, index: np.ndarray) -> np.ndarray:
        """uint8 ``[len(index), C, H, W]`` for the given local row numbers, in that order.

        Pixel stores only: encoded and variable-sized samples are read from the ``image_bytes``
        and ``image_offsets`` columns by ``cachekit.encoding``, the same for every backend.
        """

    def column(self, name: str, index: np.ndarray) -> np.ndarray:
        """Rows of ``labels`` or of a per-sample extra."""

    def close(self) -> None: ...


class ShardFormat(Protocol):
    """A backend: how a shard is encoded on disk and decoded again. Nothing else knows its details."""

    name: str
    extension: str
    #: File descriptors an open reader holds (bounds how many shards a process keeps open).
    files_per_reader: int
    #: Whether the library may crash the process when the disk fills mid-write (libhdf5 does): such
    #: a shard is only started with room for its uncompressed size.
    crashes_when_disk_fills: bool

    def write(self, path: Path, arrays: dict[str, np.ndarray], options: dict) -> None:
        """Write the shard ``arrays`` (``images``, ``labels``, extras) to ``path`` in one go."""

    def open(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> ShardReader:
        """A reader for a shard the manifest says holds ``samples`` rows shaped like ``spec``.

        ``store`` is how images are kept: ``"pixels"`` (an ``images`` array when fixed-size), or
        ``image_bytes`` + offsets: ragged pixels, ``"pixels-hwc"``, or encoded.
        """


def shard_mode(path: Path, what: str = "shard file") -> int:
    """The mode of the shard at ``path`` (links followed: the cache's ``shard_path`` has checked
    them); a CacheError naming the shard when it is missing (``what`` says what it should be) or
    cannot be read."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        raise CacheError(f"{path.name}: {what} is missing") from None
    except OSError as exc:
        raise CacheError(f"{path.name}: cannot be read ({exc.strerror or exc})") from None


def check_regular_file(path: Path) -> None:
    """Raise CacheError unless ``path`` is a regular file (a FIFO would block ``open`` forever)."""
    if not stat.S_ISREG(shard_mode(path)):
        raise CacheError(f"{path.name}: not a regular file")


def map_file(path: Path, what: str) -> np.ndarray:
    """The whole regular file ``path`` as a read-only uint8 array over a private memory map.

    The map holds no file descriptor (torch closes it once mapped, as for ``.pt`` shards), so an
    open shard costs address space, not one of the process's descriptors; it is unmapped when the
    last array viewing it goes. The file is opened non-blocking and checked with ``fstat`` first,
    then mapped through that descriptor: a FIFO swapped in meanwhile cannot block. ``what`` names
    the file in errors.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CacheError(f"{what} is missing") from None
    except OSError as exc:
        if out_of_files(exc):
            raise OpenFilesExhausted(f"{what}: cannot be opened ({exc})") from None
        raise CacheError(f"{what}: cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"{what} is not a regular file")
        if st.st_size == 0:
            raise CacheError(f"{what} is empty")
        via = f"/proc/self/fd/{fd}" if os.path.exists(f"/proc/self/fd/{fd}") else os.fspath(path)
        storage = torch.UntypedStorage.from_file(via, shared=False, nbytes=st.st_size)
    except (OSError, RuntimeError) as exc:
        if out_of_files(exc):
            raise OpenFilesExhausted(f"{what}: cannot be mapped ({exc})") from None
        raise CacheError(f"{what}: cannot be mapped ({exc})") from None
    finally:
        os.close(fd)
    array = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    array.flags.writeable = False  # a private map: a write would only copy the page, never reach the file
    return array


def identity_column(name: str) -> np.ndarray:
    """The ``shard_name`` column a writer stores in shard ``name``: its file name as UTF-8 bytes.

    Shard file names are content keys (a hash of the build options and the shard's inputs), so
    the name is the shard's identity; it survives ``--update`` (a reused shard keeps its name
    wherever it moves in the shard list) and fetches into a local shard cache (same name).
    """
    return np.frombuffer(name.encode("utf-8"), dtype=np.uint8).copy()


def check_identity(path: Path, stored) -> None:
    """Raise CacheError unless the shard's ``shard_name`` column names the file it was opened as.

    ``stored`` is the column as an array-like (numpy, HDF5 or zarr), or None if the shard has
    none; its shape and dtype are checked before it is read. This is how a reader tells a shard
    swapped for another (or renamed) without a full sha256.
    """
    if stored is None:
        raise CacheError(
            f"{path.name}: shard has no {SHARD_NAME_COLUMN!r} column (written by another version of cachekit?)"
        )
    if len(stored.shape) != 1 or stored.shape[0] > 1024 or np.dtype(stored.dtype) != np.uint8:
        raise CacheError(f"{path.name}: {SHARD_NAME_COLUMN!r} is not a short uint8 string")
    name = np.asarray(stored[...]).tobytes().decode("utf-8", errors="replace")
    if name != path.name:
        raise CacheError(
            f"{path.name}: the file holds shard {name!r}, not {path.name!r} "
            "(a shard file was swapped or renamed)"
        )


def prefetch_file(path: Path) -> None:
    """Ask the kernel to start reading the whole shard into the page cache in the background.

    Memory-mapped reads of a cold shard otherwise fault in one small read-ahead window at a time
    (random rows defeat the kernel's sequential detection); a shard is read soon after it is opened.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_arrays(
    path: Path, arrays: dict[str, np.ndarray], spec: SampleSpec, samples: int, store: str = "pixels"
) -> None:
    """Raise CacheError unless a shard's arrays are the shard it is named and the manifest describes.

    ``arrays`` maps column names to array-likes (numpy arrays, HDF5 or zarr arrays); only their
    ``shape`` and ``dtype`` are looked at, except the small identity column, which is read.
    """
    check_identity(path, arrays.get(SHARD_NAME_COLUMN))
    expected = {"labels": ((samples,), np.dtype(spec.label_dtype))}
    if spec.ragged or shaped_store(store):
        expected["image_shape"] = ((samples, 3), np.dtype("<i4"))
    if store == "pixels" and not spec.ragged:
        expected["images"] = ((samples, *spec.shape), np.dtype(spec.dtype))
    else:
        expected["image_offsets"] = ((samples + 1,), np.dtype("<i8"))
        got = arrays.get("image_bytes")
        if got is None or got.ndim != 1 or np.dtype(got.dtype) != np.uint8:
            raise CacheError(f"{path.name}: shard has no 1-D uint8 'image_bytes' array")
    for name, extra in spec.extras.items():
        expected[name] = ((samples, *extra.shape), np.dtype(extra.dtype))
    ragged = {}
    for name, column in field_columns(spec.fields).items():
        if column.ragged:  # any number of rows, each of this shape
            ragged[name] = (column.shape, np.dtype(column.dtype))
        else:
            expected[name] = (((samples + 1) if name.endswith("__offsets") else samples, *column.shape),
                              np.dtype(column.dtype))  # fmt: skip
    for name, (tail, dtype) in ragged.items():
        got = arrays.get(name)
        if got is None:
            raise CacheError(f"{path.name}: shard has no {name!r} array")
        if tuple(got.shape[1:]) != tail or len(got.shape) != 1 + len(tail) or np.dtype(got.dtype) != dtype:
            raise CacheError(
                f"{path.name}: {name!r} is {got.dtype}{list(got.shape)}, manifest says {dtype}[*, {', '.join(map(str, tail))}]"
            )
    for name, (shape, dtype) in expected.items():
        if name not in arrays:
            raise CacheError(f"{path.name}: shard has no {name!r} array")
        got = arrays[name]
        if tuple(got.shape) != shape or np.dtype(got.dtype) != dtype:
            raise CacheError(
                f"{path.name}: {name!r} is {got.dtype}{list(got.shape)}, manifest says {dtype}{list(shape)}"
            )
