"""HDF5 shards: one dataset per column, images chunked one sample per chunk for random reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import CacheError, UsageError
from ..manifest import SampleSpec
from .base import check_arrays, prefetch_file

__all__ = ["Hdf5Format", "Hdf5Reader"]

_COMPRESSION = {"none": None, "gzip": "gzip", "lzf": "lzf"}
#: Codecs HDF5 gets from the hdf5plugin package (an optional dependency), by its class name.
_PLUGIN = {"zstd": "Zstd", "lz4": "LZ4"}


def _hdf5plugin():
    try:
        import hdf5plugin
    except ImportError:
        raise UsageError("HDF5 zstd/lz4 compression needs hdf5plugin: pip install hdf5plugin") from None
    return hdf5plugin


def _h5py():
    import h5py

    return h5py


def _mapped_images(path: Path, dataset) -> np.ndarray | None:
    """The images as a read-only memory map, when every chunk is stored raw and evenly spaced.

    That is how ``Hdf5Format.write`` lays out an uncompressed shard; reading it through the map
    is a plain memcpy per sample instead of an HDF5 selection (~200x faster for random rows).
    Compressed or rearranged files return None and are read through h5py.
    """
    if dataset.compression is not None or dataset.chunks != (1, *dataset.shape[1:]):
        return None
    row = int(np.prod(dataset.shape[1:])) * dataset.dtype.itemsize
    found: list[tuple[int, int, int, int]] = []
    try:
        dataset.id.chunk_iter(
            lambda s: found.append((s.chunk_offset[0], s.byte_offset, s.size, s.filter_mask))
        )
    except (AttributeError, RuntimeError, OSError):
        return None
    found.sort()
    if len(found) != dataset.shape[0] or any(size != row or mask for _, _, size, mask in found):
        return None
    offsets = np.array([offset for _, offset, _, _ in found], dtype=np.int64)
    if (np.diff(offsets) != row).any() or offsets[-1] + row > path.stat().st_size:
        return None
    prefetch_file(path)
    mapped = np.memmap(path, dtype=dataset.dtype, mode="r", offset=int(offsets[0]), shape=dataset.shape)
    return mapped


class Hdf5Reader:
    def __init__(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> None:
        h5py = _h5py()
        if not path.is_file():
            raise CacheError(f"{path.name}: shard file is missing")
        try:
            self._file = h5py.File(path, "r")
            arrays = {k: self._file[k] for k in self._file.keys() if isinstance(self._file[k], h5py.Dataset)}
        except OSError as exc:
            raise CacheError(f"{path.name}: not a readable HDF5 shard ({exc})") from None
        check_arrays(path, arrays, spec, samples, store)
        self._images = arrays.get("images")
        self._columns = {k: v[()] for k, v in arrays.items() if k != "images"}
        self._len = samples
        variable = store != "pixels" or spec.ragged  # bytes + offsets, no images array
        self.image_array = _mapped_images(path, self._images) if samples and not variable else None

    def __len__(self) -> int:
        return self._len

    def images(self, index: np.ndarray) -> np.ndarray:
        # One read per row: h5py's fancy indexing builds a point selection that is ~60x slower
        # (measured here on gzip shards).
        index = np.asarray(index, dtype=np.int64)
        out = np.empty((len(index), *self._images.shape[1:]), dtype=self._images.dtype)
        try:
            for j, i in enumerate(index.tolist()):
                self._images.read_direct(out, np.s_[i : i + 1], np.s_[j : j + 1])
        except (OSError, ValueError) as exc:
            raise CacheError(f"HDF5 shard read failed ({exc})") from None
        return out

    def column(self, name: str, index: np.ndarray) -> np.ndarray:
        return self._columns[name][index]

    def close(self) -> None:
        self.image_array = None
        try:
            self._file.close()
        except Exception:
            pass


class Hdf5Format:
    name = "hdf5"
    extension = ".h5"

    def check_options(self, options: dict) -> None:
        codec = options.get("compression", "none")
        if codec in _PLUGIN:
            _hdf5plugin()
        elif codec not in _COMPRESSION:
            known = ", ".join([*_COMPRESSION, *_PLUGIN])
            raise UsageError(f"HDF5 compression must be one of {known}, got {codec!r}")

    def write(self, path: Path, arrays: dict[str, np.ndarray], options: dict) -> None:
        h5py = _h5py()
        codec = options.get("compression", "none")
        if codec in _PLUGIN:
            compression = dict(getattr(_hdf5plugin(), _PLUGIN[codec])())
        else:
            compression = {"compression": _COMPRESSION[codec]}
        with h5py.File(path, "w", libver="v110", track_order=False) as f:
            for name, arr in arrays.items():
                chunks = (1, *arr.shape[1:]) if name == "images" and len(arr) else None
                f.create_dataset(
                    name,
                    data=arr,
                    chunks=chunks,
                    track_times=False,
                    **(compression if name == "images" and len(arr) else {}),
                )

    def open(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> Hdf5Reader:
        try:  # registers the zstd/lz4 filters with HDF5, should this shard use them
            import hdf5plugin  # noqa: F401
        except ImportError:
            pass
        return Hdf5Reader(path, spec, samples, store)
