"""``.pt`` shards: a dict of tensors written by ``torch.save``, read back memory-mapped.

Reading uses ``torch.load(mmap=True, weights_only=True)``: no pickle code runs, and rows are paged
in from the OS page cache on demand instead of loading the whole shard.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from ...errors import CacheError, UsageError
from ..samplespec import SampleSpec
from .base import OpenFilesExhausted, check_arrays, check_regular_file, out_of_files, prefetch_file

__all__ = ["PtFormat", "PtReader"]

#: What torch names when it refuses a pickled object: "GLOBAL posix.system", "Unsupported global: ...".
_GLOBAL = re.compile(r"\bGLOBAL\s+([A-Za-z_][\w.]*)")


def _refused(exc: BaseException) -> str:
    """Why torch's weights-only loader refused a shard, without its advice to load it unsafely."""
    named = _GLOBAL.search(str(exc))
    what = f" ({named.group(1)})" if named else ""
    return (
        f"not a loadable .pt shard: it holds pickled Python objects{what}, which a shard never has; "
        "refused unread, nothing of it ran: rebuild the cache, or restore the shard from where it was built"
    )


class PtReader:
    def __init__(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> None:
        check_regular_file(path)
        try:
            obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except FileNotFoundError:
            raise CacheError(f"{path.name}: shard file is missing") from None
        except pickle.UnpicklingError as exc:
            raise CacheError(f"{path.name}: {_refused(exc)}") from None
        except (
            RuntimeError,
            OSError,
            zipfile.BadZipFile,
            EOFError,
            ValueError,
        ) as exc:
            if out_of_files(exc):
                raise OpenFilesExhausted(f"{path.name}: cannot be opened ({exc})") from None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CacheError(f"{path.name}: not a loadable .pt shard ({first})") from None
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise CacheError(f"{path.name}: expected a dict of tensors")
        self._arrays = {k: v.numpy() for k, v in obj.items()}
        check_arrays(path, self._arrays, spec, samples, store)
        prefetch_file(path)
        self._len = samples

    def __len__(self) -> int:
        return self._len

    @property
    def image_array(self) -> np.ndarray | None:
        """The memory-mapped ``[N, C, H, W]`` array itself, for copies straight into a batch."""
        return self._arrays.get("images")

    def images(self, index: np.ndarray) -> np.ndarray:
        return self._arrays["images"][index]

    def column(self, name: str, index: np.ndarray) -> np.ndarray:
        return self._arrays[name][index]

    def close(self) -> None:
        self._arrays = {}


class PtFormat:
    name = "pt"
    extension = ".pt"
    files_per_reader = 0  # torch maps the file and closes it
    crashes_when_disk_fills = False

    def check_options(self, options: dict) -> None:
        if options.get("compression", "none") != "none":
            raise UsageError(
                ".pt shards are stored uncompressed (they are memory-mapped); "
                "use --format hdf5 or zarr for compression"
            )

    def write(self, path: Path, arrays: dict[str, np.ndarray], options: dict) -> None:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        # Through a file object the archive's inner folder is always "archive"; given a path, torch
        # names it after the (temporary) file name and the bytes would differ from build to build.
        with open(path, "wb") as fh:
            torch.save(tensors, fh)

    def open(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> PtReader:
        return PtReader(path, spec, samples, store)
