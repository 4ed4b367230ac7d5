"""The binary shard index (``index.bin``, format 5): every shard's offsets, size, checksums and names
in fixed-layout little-endian columns, memory-mapped and shared by a node's processes.

``manifest.json`` keeps the human-readable summary and names this file with its size and sha256
(the manifest is written last). A reader maps the file and looks a shard up when it needs it, so
opening a cache costs the same at 1,000 shards as at 10 million: no JSON list of shards parsed into
Python objects, nothing per shard pickled to worker processes (an index travels by path and is
mapped again there). Layout (docs/FORMAT.md):

    bytes 0-7    magic b"CKINDEX\\0"
    bytes 8-11   <u4 version (1)
    bytes 12-15  <u4 length of the JSON header that follows
    header       {"shards": N, "samples": S, "channels": C, "columns": [{"name", "dtype", "shape", "offset"}]}
    columns      each at its offset (a multiple of 64), C order, little-endian, in the header's order
"""

from __future__ import annotations

import json
import mmap
import os
import re
import stat
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import CacheError
from .limits import MAX_SAMPLES, MAX_SHARD_BYTES, MAX_SHARD_ROWS, short
from .shardfiles import check_shard_name

__all__ = [
    "INDEX_NAME",
    "INDEX_VERSION",
    "ShardIndex",
    "write_index",
    "write_index_columns",
    "index_record",
    "check_record",
]

#: How a format 5 cache names its shard index: by its content (the manifest names it), so a reader
#: that maps it later (a worker process) maps the version its manifest describes.
INDEX_NAME = "index-{digest}.bin"
#: The layout version this code writes and reads.
INDEX_VERSION = 1
_MAGIC = b"CKINDEX\0"
_HEAD = struct.Struct("<8sII")
_ALIGN = 64
_MAX_HEADER = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

#: Columns and their dtypes (shape: ``N`` shards, ``N1`` = N + 1 offsets, ``C`` channels, ``B`` bytes).
_COLUMNS = {
    "offsets": ("<i8", ("N1",)),  # global index of each shard's first sample; the last entry: samples
    "bytes": ("<i8", ("N",)),
    "sha256": ("|u1", ("N", 32)),
    "inputs": ("<i8", ("N",)),
    "inputs_digest": ("|u1", ("N", 32)),
    "pixel_sum": ("<f8", ("N", "C")),
    "pixel_sumsq": ("<f8", ("N", "C")),
    "pixel_count": ("<i8", ("N",)),
    "name_offsets": ("<i8", ("N1",)),  # shard file names: UTF-8 in one buffer
    "name_bytes": ("|u1", ("B",)),
    "first_offsets": ("<i8", ("N1",)),  # each shard's first and last source path (surrogates escaped)
    "first_bytes": ("|u1", ("B",)),
    "last_offsets": ("<i8", ("N1",)),
    "last_bytes": ("|u1", ("B",)),
}


def _strings(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [v.encode("utf-8", "surrogateescape") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype="<i8")
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return offsets, np.frombuffer(b"".join(encoded), dtype="|u1")


def write_index(path: Path, shards: Sequence, channels: int) -> None:
    """Write the index of ``shards`` (``ShardInfo``s, in the manifest's order) to ``path``."""
    n = len(shards)
    counts = np.fromiter((s.samples for s in shards), dtype="<i8", count=n)
    cols = {
        "offsets": np.concatenate([[0], np.cumsum(counts)]).astype("<i8"),
        "bytes": np.fromiter((s.bytes for s in shards), dtype="<i8", count=n),
        "sha256": np.frombuffer(b"".join(bytes.fromhex(s.sha256) for s in shards), "|u1").reshape(n, 32),
        "inputs": np.fromiter((s.inputs for s in shards), dtype="<i8", count=n),
        "inputs_digest": np.frombuffer(
            b"".join(bytes.fromhex(s.inputs_digest) for s in shards), "|u1"
        ).reshape(n, 32),
        "pixel_sum": np.array([s.pixel_sum for s in shards], dtype="<f8").reshape(n, channels),
        "pixel_sumsq": np.array([s.pixel_sumsq for s in shards], dtype="<f8").reshape(n, channels),
        "pixel_count": np.fromiter((s.pixel_count for s in shards), dtype="<i8", count=n),
    }
    for key, attr in (("name", "file"), ("first", "first"), ("last", "last")):
        cols[f"{key}_offsets"], cols[f"{key}_bytes"] = _strings([getattr(s, attr) for s in shards])
    write_index_columns(path, cols, channels)


def write_index_columns(path: Path, cols: dict[str, np.ndarray], channels: int) -> None:
    """Write an index from its columns (``_COLUMNS``' names, shapes and dtypes; checked when mapped)."""
    missing = set(_COLUMNS) - set(cols)
    if missing:
        raise ValueError(f"index columns missing: {sorted(missing)}")
    n = len(cols["offsets"]) - 1
    table = []
    header_room = 4096 + 64 * len(cols)
    offset = _HEAD.size + header_room
    for name, (dtype, _) in _COLUMNS.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        arr = np.ascontiguousarray(cols[name], dtype=dtype)
        table.append({"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset})
        offset += arr.nbytes
    header = json.dumps(
        {"shards": n, "samples": int(cols["offsets"][-1]), "channels": channels, "columns": table}
    ).encode()
    if len(header) > header_room:
        raise CacheError(f"{path.name}: index header of {len(header)} bytes does not fit")
    with open(path, "wb") as fh:
        fh.write(_HEAD.pack(_MAGIC, INDEX_VERSION, len(header)) + header)
        for entry, (name, (dtype, _)) in zip(table, _COLUMNS.items()):
            fh.seek(entry["offset"])
            fh.write(np.ascontiguousarray(cols[name], dtype=dtype).tobytes())
        fh.truncate(offset)


def index_record(file: str, size: int, sha256: str, shards: int, samples: int) -> dict:
    """What ``manifest.json`` says of its index: the file, its size and sha256, the counts."""
    return {
        "file": file,
        "version": INDEX_VERSION,
        "bytes": int(size),
        "sha256": sha256,
        "shards": int(shards),
        "samples": int(samples),
    }


def check_record(obj: object, where: str) -> dict:
    """The manifest's ``index`` object, validated (types and bounds; the file is checked when mapped)."""
    if not isinstance(obj, dict):
        raise CacheError(f"{where}: expected an object, got {short(obj)}")
    out = {}
    for key, top in (
        ("version", 2**31),
        ("bytes", MAX_SHARD_BYTES),
        ("shards", MAX_SAMPLES),
        ("samples", MAX_SAMPLES),
    ):
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise CacheError(f"{where}.{key}: expected a whole number from 0 to {top}, got {short(value)}")
        out[key] = value
    if out["version"] != INDEX_VERSION:
        raise CacheError(
            f"index format mismatch: code={INDEX_VERSION}, file={out['version']}; rebuild the cache with this version"
        )
    if out["shards"] < 1:
        raise CacheError(f"{where}.shards: a cache has at least one shard")
    sha = obj.get("sha256")
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):  # "$" alone would let a final newline in
        raise CacheError(f"{where}.sha256: expected 64 lowercase hex digits, got {short(sha)}")
    out["sha256"] = sha
    out["file"] = check_shard_name(obj.get("file"), f"{where}.file")
    return out


class ShardIndex:
    """A mapped ``index.bin``: columns as read-only numpy views over one shared memory map.

    Opened (and checked) when made; a copy unpickled in another process holds the path only and
    maps the file when first used, so workers share the node's pages instead of a pickled copy.
    """

    def __init__(self, path: str | os.PathLike, record: dict, *, lazy: bool = False) -> None:
        self.path = Path(path)
        self.record = dict(record)
        self._cols: dict[str, np.ndarray] | None = None
        if not lazy:
            self._open()

    def __getstate__(self) -> dict:
        return {"path": self.path, "record": self.record, "_cols": None}

    def _bad(self, why: str) -> CacheError:
        return CacheError(
            f"{self.path}: not a valid shard index ({why}); rebuild the cache or restore the file"
        )

    def _open(self) -> dict[str, np.ndarray]:
        if self._cols is not None:
            return self._cols
        try:
            flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(self.path, flags | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
        except FileNotFoundError:
            raise CacheError(f"{self.path}: the cache's shard index is missing") from None
        except OSError as exc:
            raise CacheError(
                f"{self.path}: the shard index cannot be opened ({exc.strerror or exc})"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._bad("not a regular file")
            size = st.st_size
            if size != self.record["bytes"]:
                raise self._bad(f"{size} bytes, the manifest says {self.record['bytes']}")
            if size < _HEAD.size:
                raise self._bad("too short")
            try:
                data = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            except (OSError, ValueError) as exc:
                raise self._bad(f"cannot be mapped ({getattr(exc, 'strerror', None) or exc})") from None
        finally:
            os.close(fd)
        magic, version, length = _HEAD.unpack_from(data)
        if magic != _MAGIC or version != INDEX_VERSION or length > min(_MAX_HEADER, size - _HEAD.size):
            raise self._bad("bad magic, version or header")
        try:
            header = json.loads(bytes(data[_HEAD.size : _HEAD.size + length]))
            self._cols = self._columns(data, header, size, _HEAD.size + length)
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError, AttributeError) as exc:
            raise self._bad(f"bad header: {short(str(exc))}") from None
        return self._cols

    def _columns(self, data: mmap.mmap, header: dict, size: int, start: int) -> dict[str, np.ndarray]:
        """The columns the header names, each checked to lie between the header's end (``start``) and
        the file's: a column over the header would read its JSON as numbers."""
        n, samples, channels = header["shards"], header["samples"], header["channels"]
        if (n, samples) != (self.record["shards"], self.record["samples"]) or channels not in (1, 3):
            raise self._bad("its counts are not the manifest's")
        entries = {e["name"]: e for e in header["columns"]}
        cols = {}
        dims = {"N": n, "N1": n + 1, "C": channels}
        for name, (dtype, shape) in _COLUMNS.items():
            e = entries[name]
            got = tuple(int(x) for x in e["shape"])
            want = tuple(dims.get(d, got[i] if i < len(got) else -1) for i, d in enumerate(shape))
            if e["dtype"] != dtype or got != want or any(x < 0 for x in got):
                raise self._bad(f"column {name} is {e['dtype']} {list(got)}, expected {dtype} {list(want)}")
            count, offset = int(np.prod(got)), int(e["offset"])
            if offset < 0 or offset % _ALIGN or offset + count * np.dtype(dtype).itemsize > size:
                raise self._bad(f"column {name} lies outside the file")
            if offset < start:
                raise self._bad(
                    f"column {name} lies inside the header (offset {offset}, the header ends at {start})"
                )
            cols[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(got)
        self._check(cols, n, samples)
        return cols

    def _check(self, cols: dict[str, np.ndarray], n: int, samples: int) -> None:
        """Every count, size and offset in bounds, in one pass of array operations (no per-shard Python)."""
        offsets, counts = cols["offsets"], np.diff(cols["offsets"])
        if offsets[0] != 0 or offsets[-1] != samples or (counts < 0).any() or (counts > MAX_SHARD_ROWS).any():
            raise self._bad("shard offsets are not increasing from 0 to the samples")
        if ((cols["bytes"] < 1) | (cols["bytes"] > MAX_SHARD_BYTES)).any():
            raise self._bad("a shard size is out of range")
        # a shard is planned for one input or more (it may keep no sample: all its inputs skipped)
        inputs = cols["inputs"]
        if ((inputs < 1) | (inputs > MAX_SHARD_ROWS)).any() or (cols["pixel_count"] < 0).any():
            raise self._bad("an input or pixel count is out of range")
        for key in ("name", "first", "last"):
            o, b = cols[f"{key}_offsets"], cols[f"{key}_bytes"]
            if o[0] != 0 or o[-1] != len(b) or (np.diff(o) < 0).any():
                raise self._bad(f"{key} offsets are not increasing through their buffer")
        if (np.diff(cols["name_offsets"]) < 1).any():
            raise self._bad("a shard has an empty file name")

    @property
    def columns(self) -> dict[str, np.ndarray]:
        return self._open()

    def __len__(self) -> int:
        return int(self.record["shards"])

    def text(self, key: str, k: int) -> str:
        cols = self._open()
        o = cols[f"{key}_offsets"]
        return bytes(cols[f"{key}_bytes"][o[k] : o[k + 1]]).decode("utf-8", "surrogateescape")
