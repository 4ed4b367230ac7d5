"""HDF5 shards: one dataset per column, images chunked one sample per chunk for random reads.

HDF5 can make a file read other files: external links, external raw storage, virtual datasets.
A shard may hold none of them: its root holds datasets by hard links only, each stored inside the
file, and anything else is refused before it is followed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...constants import DIST_NAME
from ...errors import CacheError, UsageError
from ..samplespec import SampleSpec
from .base import OpenFilesExhausted, check_arrays, check_regular_file, map_file, out_of_files, prefetch_file

__all__ = ["Hdf5Format", "Hdf5Reader"]

_COMPRESSION = {"none": None, "gzip": "gzip", "lzf": "lzf"}
#: Codecs HDF5 gets from the hdf5plugin package (an optional dependency), by its class name.
_PLUGIN = {"zstd": "Zstd", "lz4": "LZ4"}


def _hdf5plugin():
    try:
        import hdf5plugin
    except ImportError:
        raise UsageError(
            f"HDF5 zstd/lz4 compression needs hdf5plugin: pip install '{DIST_NAME}[hdf5]'"
        ) from None
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
    if (np.diff(offsets) != row).any():
        return None  # laid out otherwise: read through h5py
    size = path.stat().st_size
    if offsets[0] < 0 or offsets[-1] + row > size:  # no library writes that: cut short, or crafted
        raise CacheError(
            f"{path.name}: its images' chunks run past the end of the file ({int(offsets[0])} + "
            f"{len(found)} x {row} bytes, the file has {size}): truncated or crafted"
        )
    mapped = map_file(path, path.name)
    prefetch_file(path)
    return np.ndarray(dataset.shape, dtype=dataset.dtype, buffer=mapped, offset=int(offsets[0]))


def _column(path: Path, name: str, dataset) -> np.ndarray:
    """A column in memory, but a variable-size shard's ``image_bytes`` (its pixels or encoded
    images, most of the file) as a read-only memory map when stored contiguous and raw, as
    ``Hdf5Format.write`` stores it: every reader process then shares the page cache instead of
    holding its own copy of the shard."""
    offset = dataset.id.get_offset() if name == "image_bytes" and dataset.chunks is None else None
    if offset is None or dataset.dtype != np.uint8 or dataset.ndim != 1 or dataset.compression is not None:
        return dataset[()]  # empty (no storage allocated), compressed or laid out otherwise
    size = path.stat().st_size
    if offset < 0 or offset + dataset.shape[0] > size:
        raise CacheError(
            f"{path.name}: its image bytes run past the end of the file ({offset} + {dataset.shape[0]} "
            f"bytes, the file has {size}): truncated or crafted"
        )
    mapped = map_file(path, path.name)
    prefetch_file(path)
    return np.ndarray(dataset.shape, dtype=np.uint8, buffer=mapped, offset=offset)


def _datasets(path: Path, file) -> dict:
    """The root's datasets by name, after refusing anything that could read outside the file."""
    h5py = _h5py()
    found = {}
    for name in file.keys():  # link names: nothing is followed yet
        kind = file.id.links.get_info(name.encode()).type
        if kind == h5py.h5l.TYPE_EXTERNAL:
            target = file.get(name, getlink=True)
            raise CacheError(
                f"{path.name}: {name!r} is an external link to {target.filename!r} "
                "(a shard may not read other files)"
            )
        if kind != h5py.h5l.TYPE_HARD:
            raise CacheError(f"{path.name}: {name!r} is a soft or user-defined link (a shard holds its data)")
        obj = file[name]
        if not isinstance(obj, h5py.Dataset):
            raise CacheError(f"{path.name}: {name!r} is a group (a shard holds only datasets)")
        if obj.is_virtual:
            raise CacheError(
                f"{path.name}: {name!r} is a virtual dataset (its data would be read from other files)"
            )
        if obj.external:
            raise CacheError(
                f"{path.name}: {name!r} keeps its data in external files {[e[0] for e in obj.external]} "
                "(a shard may not read other files)"
            )
        found[name] = obj
    return found


class Hdf5Reader:
    def __init__(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> None:
        h5py = _h5py()
        check_regular_file(path)
        try:
            self._file = h5py.File(path, "r")
        except OSError as exc:
            if out_of_files(exc):
                raise OpenFilesExhausted(f"{path.name}: cannot be opened ({exc})") from None
            raise CacheError(f"{path.name}: not a readable HDF5 shard ({exc})") from None
        try:
            try:
                arrays = _datasets(path, self._file)
                check_arrays(path, arrays, spec, samples, store)
                self._columns = {k: _column(path, k, v) for k, v in arrays.items() if k != "images"}
            except (OSError, KeyError, ValueError, TypeError) as exc:  # damaged object headers
                raise CacheError(f"{path.name}: not a readable HDF5 shard ({exc})") from None
            self._images = arrays.get("images")
            self._len = samples
            variable = store != "pixels" or spec.ragged  # bytes + offsets, no images array
            self.image_array = _mapped_images(path, self._images) if samples and not variable else None
        except BaseException:
            self._file.close()
            raise
        if self.image_array is not None or self._images is None:
            # the columns are in memory and the images mapped (or stored as bytes): the file is
            # not read again, so it keeps no descriptor; only compressed images stay with h5py
            self._file.close()
            self._images = None

    def __len__(self) -> int:
        return self._len

    def images(self, index: np.ndarray) -> np.ndarray:
        # One read per row: h5py's fancy indexing builds a point selection that is ~60x slower
        # (measured here on gzip shards).
        index = np.asarray(index, dtype=np.int64)
        if self.image_array is not None:
            return self.image_array[index]
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
        """Close the file; the memory map goes with the last array that views it (a batch never does)."""
        self.image_array = None
        self._images = None
        self._columns = {}
        try:
            self._file.close()
        except Exception:
            pass


class Hdf5Format:
    name = "hdf5"
    extension = ".h5"
    files_per_reader = 1  # compressed images are read through the open file; others keep none
    crashes_when_disk_fills = True

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
