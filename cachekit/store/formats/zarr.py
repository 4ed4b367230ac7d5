"""zarr v3 shards: one small zarr group per shard, images grouped by zarr's sharding codec.

A shard is a folder ``shard-….zarr`` holding a zarr v3 group with one array per column. The
``images`` array has one inner chunk per sample, packed by the ``sharding_indexed`` codec into a
single file (the inner chunks back to back, then an index of their offsets). Any zarr v3 reader
opens it. cachekit reads that file itself: the index gives each sample's byte range, which is a
memory-mapped view when uncompressed, or one codec call (Blosc, Zstd, gzip) when compressed:
~100x faster than going through zarr's chunk machinery per random row (measured here).

Reading trusts nothing in the folder: every entry must be a folder or a regular file (checked
before zarr opens anything: a FIFO would block), the sharding index must pass its crc32c and each
offset and size is checked as unsigned against the file's size.
"""

from __future__ import annotations

import json
import stat
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...errors import CacheError, UsageError
from ..samplespec import SampleSpec
from ..shardfiles import check_plain_tree
from .base import OpenFilesExhausted, check_arrays, map_file, out_of_files, prefetch_file, shard_mode

__all__ = ["ZarrFormat", "ZarrReader", "CODECS"]

#: --compression name -> the zarr v3 codec that implements it (None: stored raw).
CODECS = {"none": None, "zstd": ("blosc", "zstd"), "lz4": ("blosc", "lz4"), "gzip": ("gzip", None)}
_INDEX_ENTRY = 16  # (offset, nbytes) as two little-endian uint64
_CRC = 4
_MISSING = np.uint64(2**64 - 1)  # an inner chunk zarr did not write


def _zarr():
    try:
        import zarr
    except ImportError:
        raise UsageError("--format zarr needs zarr v3: pip install 'zarr>=3'") from None
    return zarr


def _compressor(name: str):
    from zarr.codecs import BloscCodec, GzipCodec

    kind = CODECS[name]
    if kind is None:
        return None
    if kind[0] == "blosc":
        return BloscCodec(cname=kind[1], clevel=5, shuffle="noshuffle", typesize=1)
    return GzipCodec(level=5)


def _decoder(codecs: list[dict]) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """``decode(raw, out)`` undoing the inner chunk codecs into ``out``, or None for raw bytes.

    ``decode`` raises unless ``raw`` decompresses to exactly ``out.size`` bytes, and never
    allocates more than that: a chunk claiming gigabytes is an error, not an allocation.
    """
    names = [c.get("name") if isinstance(c, dict) else None for c in codecs]
    if names == ["bytes"]:
        return None
    if len(names) == 2 and names[0] == "bytes" and names[1] in ("blosc", "zstd", "gzip"):
        return {"blosc": _unblosc, "zstd": _unzstd, "gzip": _gunzip}[names[1]]
    raise CacheError(f"unsupported zarr codecs {names[:4]}")


def _unblosc(raw: np.ndarray, out: np.ndarray) -> None:
    import numcodecs

    # Blosc's 16-byte header: version, versionlz, flags, typesize, then uint32 LE nbytes,
    # blocksize and cbytes. Blosc trusts cbytes: a chunk cut short would be read past its end.
    if raw.size < 16 or int.from_bytes(raw[12:16].tobytes(), "little") != raw.size:
        raise ValueError("its Blosc header does not match its size")
    declared = int.from_bytes(raw[4:8].tobytes(), "little")
    if declared != out.size:
        raise ValueError(f"it holds {declared} bytes, not {out.size}")
    numcodecs.Blosc().decode(raw, out=out)


def _unzstd(raw: np.ndarray, out: np.ndarray) -> None:
    import numcodecs

    declared = _zstd_content_size(raw.tobytes()[:18])
    if declared != out.size:
        raise ValueError(f"it holds {declared} bytes, not {out.size}")
    numcodecs.Zstd().decode(raw, out=out)


def _zstd_content_size(header: bytes) -> int | None:
    """The decompressed size a zstd frame header declares (RFC 8878, 3.1.1.1), or None."""
    if len(header) < 6 or header[:4] != b"\x28\xb5\x2f\xfd":
        return None
    flags = header[4]
    single, fcs, dict_id = (flags >> 5) & 1, flags >> 6, flags & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_id]
    width = (1 if single else 0, 2, 4, 8)[fcs]
    if width == 0 or len(header) < pos + width:
        return None
    value = int.from_bytes(header[pos : pos + width], "little")
    return value + 256 if width == 2 else value


def _gunzip(raw: np.ndarray, out: np.ndarray) -> None:
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # a gzip member, as numcodecs writes it
    data = inflate.decompress(raw.tobytes(), out.size + 1)
    if len(data) != out.size or not inflate.eof:
        raise ValueError(f"it does not decompress to {out.size} bytes")
    out[:] = np.frombuffer(data, dtype=np.uint8)


def _column(path: Path, name: str, array) -> np.ndarray:
    """A column in memory, but a variable-size shard's ``image_bytes`` (its pixels or encoded
    images, most of the shard) as a read-only memory map of its one raw chunk, as ``ZarrFormat.write``
    stores it without compression: every reader process then shares the page cache instead of
    holding its own copy. Anything else (compressed, chunked, older shards) is read through zarr."""
    if name != "image_bytes" or array.ndim != 1 or array.dtype != np.uint8 or not array.shape[0]:
        return np.asarray(array[...])
    try:
        meta = json.loads((path / name / "zarr.json").read_text())
        raw = (
            [c.get("name") for c in meta["codecs"]] == ["bytes"]
            and meta["chunk_grid"]["configuration"]["chunk_shape"] == [array.shape[0]]
            and meta["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "/"}}
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raw = False
    chunk = path / name / "c" / "0"
    if raw and not chunk.is_file():  # zarr would read the missing chunk as zeros: black pixels
        raise CacheError(f"{path.name}: its image bytes ({array.shape[0]} of them) are missing")
    if not raw or chunk.stat().st_size != array.shape[0]:
        return np.asarray(array[...])
    prefetch_file(chunk)
    return map_file(chunk, f"{path.name}: its image bytes")


class ZarrReader:
    def __init__(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> None:
        zarr = _zarr()
        if not stat.S_ISDIR(shard_mode(path, "shard folder")):
            raise CacheError(f"{path.name}: not a folder (a zarr shard is a folder)")
        try:  # before zarr opens anything: a FIFO in the folder would block its first read
            check_plain_tree(path)
        except OpenFilesExhausted:
            raise
        except CacheError as exc:
            raise CacheError(f"{path.name}: {exc}") from None
        self._name = path.name
        try:
            # zarr v3 only: its codecs only decompress, where v2 metadata may name a pickle codec
            local = zarr.storage.LocalStore(path, read_only=True)
            group = zarr.open_group(store=local, mode="r", zarr_format=3)
            arrays = {name: group[name] for name in group.array_keys()}
            check_arrays(path, arrays, spec, samples, store)
            self._columns = {k: _column(path, k, v) for k, v in arrays.items() if k != "images"}
        except CacheError:
            raise
        except Exception as exc:  # zarr raises many kinds for a damaged store
            if out_of_files(exc):
                raise OpenFilesExhausted(f"{path.name}: cannot be opened ({exc})") from None
            raise CacheError(
                f"{path.name}: not a readable zarr shard ({type(exc).__name__}: {exc})"
            ) from None
        self._len = samples
        self._row_shape = tuple(spec.shape)
        self.image_array = None
        self._offsets = self._sizes = self._data = self._decode = None
        self._empty = None
        self._fill = 0
        if samples and store == "pixels" and not spec.ragged:
            self._open_images(path / "images", samples)

    def _open_images(self, folder: Path, samples: int) -> None:
        name = folder.parent.name
        try:
            meta = json.loads((folder / "zarr.json").read_text())
            codecs = meta["codecs"]
            if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
                raise CacheError(f"{name}: images are not stored with the sharding codec")
            config = codecs[0]["configuration"]
            index_codecs = [(c.get("name"), c.get("configuration", {})) for c in config["index_codecs"]]
            layout_ok = (
                config.get("index_location", "end") == "end"
                and list(config["chunk_shape"]) == [1, *self._row_shape]
                and index_codecs == [("bytes", {"endian": "little"}), ("crc32c", {})]
            )
            fill = meta.get("fill_value", 0)
            decode = _decoder(config["codecs"])
        except CacheError:
            raise
        except (OSError, ValueError, RecursionError, KeyError, IndexError, TypeError, AttributeError) as exc:
            if out_of_files(exc):
                raise OpenFilesExhausted(f"{name}: cannot read the images metadata ({exc})") from None
            raise CacheError(f"{name}: unreadable images metadata ({type(exc).__name__}: {exc})") from None
        if not layout_ok:
            raise CacheError(f"{name}: unexpected sharding layout {str(config)[:200]}")
        if isinstance(fill, bool) or not isinstance(fill, int) or not 0 <= fill <= 255:
            raise CacheError(f"{name}: images fill_value {fill!r} is not a uint8")
        self._decode = decode
        data = map_file(folder / "c" / "0" / "0" / "0" / "0", f"{name}: the images shard file")
        offsets, sizes, empty = _read_index(data, samples, name)
        self._data, self._offsets, self._sizes, self._empty, self._fill = data, offsets, sizes, empty, fill
        row = int(np.prod(self._row_shape))
        if (
            self._decode is None
            and not empty.any()
            and (sizes == row).all()
            and (np.diff(offsets) == row).all()
        ):
            self.image_array = np.ndarray(
                (samples, *self._row_shape), dtype=np.uint8, buffer=data, offset=int(offsets[0])
            )
        prefetch_file(folder / "c" / "0" / "0" / "0" / "0")

    def __len__(self) -> int:
        return self._len

    def images(self, index: np.ndarray) -> np.ndarray:
        out = np.empty((len(index), *self._row_shape), dtype=np.uint8)
        for j, i in enumerate(np.asarray(index, dtype=np.int64).tolist()):
            if self._empty[i]:  # zarr leaves out chunks equal to the fill value
                out[j] = self._fill
                continue
            raw = self._data[self._offsets[i] : self._offsets[i] + self._sizes[i]]
            if self._decode is not None:
                try:
                    self._decode(raw, out[j].reshape(-1))
                except Exception as exc:  # each codec raises its own kinds for damaged bytes
                    raise CacheError(f"{self._name}: sample {i} does not decompress ({exc})") from None
                continue
            if raw.size != out[j].size:
                raise CacheError(f"{self._name}: sample {i} decodes to {raw.size} bytes, not {out[j].size}")
            out[j] = raw.reshape(self._row_shape)
        return out

    def column(self, name: str, index: np.ndarray) -> np.ndarray:
        return self._columns[name][index]

    def close(self) -> None:
        """Drop the map; it is unmapped with the last array viewing it (a batch is a copy, never one)."""
        self.image_array = self._data = None
        self._columns = {}


def _crc32c(data: bytes) -> int:
    """CRC-32C, as zarr's ``crc32c`` codec computes it (google-crc32c, a declared dependency)."""
    import google_crc32c

    return google_crc32c.value(data)


def _read_index(data: np.ndarray, samples: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated ``(offsets, sizes, empty)`` of each inner chunk from the sharding index at the end.

    The index is ``samples`` pairs of little-endian uint64 then its CRC-32C. Every value is checked
    as unsigned against the bytes before the index (an offset with its top bit set must not wrap
    around to a negative number); ``(2**64 - 1, 2**64 - 1)`` marks a chunk zarr left out because it
    equals the fill value.
    """
    index_bytes = samples * _INDEX_ENTRY
    if len(data) < index_bytes + _CRC:
        raise CacheError(f"{name}: images shard is truncated")
    raw = data[len(data) - index_bytes - _CRC : len(data) - _CRC].tobytes()
    stored = int.from_bytes(data[len(data) - _CRC :].tobytes(), "little")
    if _crc32c(raw) != stored:
        raise CacheError(f"{name}: images shard index fails its crc32c checksum (the file is damaged)")
    index = np.frombuffer(raw, dtype="<u8").reshape(samples, 2)
    offsets, sizes = index[:, 0], index[:, 1]
    empty = (offsets == _MISSING) & (sizes == _MISSING)
    limit = np.uint64(len(data) - index_bytes - _CRC)
    bad = ~empty & ((sizes == 0) | (offsets > limit) | (sizes > limit - np.minimum(offsets, limit)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CacheError(
            f"{name}: images shard index points outside the file (sample {i}: "
            f"{int(offsets[i])} + {int(sizes[i])} bytes, {int(limit)} available)"
        )
    offsets = np.where(empty, 0, offsets).astype(np.int64)
    sizes = np.where(empty, 0, sizes).astype(np.int64)
    return offsets, sizes, empty


class ZarrFormat:
    name = "zarr"
    extension = ".zarr"
    files_per_reader = 0  # the images are mapped without keeping a descriptor
    crashes_when_disk_fills = False

    def check_options(self, options: dict) -> None:
        codec = options.get("compression", "none")
        if codec not in CODECS:
            hint = " (lzf is HDF5's; zarr has lz4)" if codec == "lzf" else ""
            raise UsageError(f"zarr compression must be one of {', '.join(CODECS)}, got {codec!r}{hint}")
        _zarr()

    def write(self, path: Path, arrays: dict[str, np.ndarray], options: dict) -> None:
        zarr = _zarr()
        compressor = _compressor(options.get("compression", "none"))
        group = zarr.group(store=zarr.storage.LocalStore(path), zarr_format=3, overwrite=True)
        for name, arr in arrays.items():
            if name == "images":
                rows = max(1, len(arr))
                images = group.create_array(
                    "images",
                    shape=arr.shape,
                    dtype=arr.dtype,
                    chunks=(1, *arr.shape[1:]),
                    shards=(rows, *arr.shape[1:]),
                    compressors=[compressor] if compressor is not None else None,
                    fill_value=0,
                    # every sample gets its bytes, an all-black one too, so the shard maps evenly
                    config={"write_empty_chunks": True},
                )
                if len(arr):
                    images[...] = arr
            elif name == "image_bytes":  # raw: one chunk, a reader maps it (``_column``)
                column = group.create_array(
                    name,
                    shape=arr.shape,
                    dtype=arr.dtype,
                    # compressed: zarr's own chunks, as a codec takes at most 2 GiB in one call (Blosc)
                    chunks=(max(1, len(arr)),) if compressor is None else "auto",
                    compressors=[compressor] if compressor is not None else None,
                    fill_value=0,
                    config={"write_empty_chunks": True},
                )
                if len(arr):
                    column[...] = arr
            else:
                group.create_array(name, data=np.ascontiguousarray(arr), fill_value=0)

    def open(self, path: Path, spec: SampleSpec, samples: int, store: str = "pixels") -> ZarrReader:
        return ZarrReader(path, spec, samples, store)
