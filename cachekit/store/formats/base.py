"""The small protocol every storage backend implements: encode a whole shard, decode rows of one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np

from ...errors import CacheError
from ..manifest import SampleSpec

__all__ = ["ShardFormat", "ShardReader", "check_arrays", "prefetch_file"]


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

    def write(self, path: Path, arrays: dict[str, np.ndarray], options: dict) -> None:
        """Write the shard ``arrays`` (``images``, ``labels``, extras) to ``path`` in one go."""

    def open(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> ShardReader:
        """A reader for a shard the manifest says holds ``samples`` rows shaped like ``spec``.

        ``store`` is how images are kept: ``"pixels"``, or encoded (``image_bytes`` + offsets).
        """


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
    """Raise CacheError unless a shard's arrays have the shapes and dtypes the manifest promises."""
    expected = {"labels": ((samples,), np.dtype(spec.label_dtype))}
    if spec.ragged:
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
    for name, (shape, dtype) in expected.items():
        if name not in arrays:
            raise CacheError(f"{path.name}: shard has no {name!r} array")
        got = arrays[name]
        if tuple(got.shape) != shape or np.dtype(got.dtype) != dtype:
            raise CacheError(
                f"{path.name}: {name!r} is {got.dtype}{list(got.shape)}, manifest says {dtype}{list(shape)}"
            )
