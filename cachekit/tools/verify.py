"""``cachekit verify``: check a cache's shards against its manifest, naming every bad one.

The manifest is validated first (``read_manifest``; format 5: its binary index mapped, its layout,
counts and offsets checked, then its sha256 and its names). Then each shard: it must be a regular file
inside the cache folder (no symlink out of it), have the recorded size and, unless ``quick``, the
recorded sha256; and its reader must open it and find the promised counts, shapes and dtypes.

A cache on object storage (an fsspec URL) is checked shard by shard through a temporary folder:
each object is downloaded, checked like a local shard and deleted; ``quick`` compares the objects'
sizes with the manifest without downloading them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CacheError
from ..store.atomic import path_size, remove_path, sha256_path
from ..store.encoding import RAW_STORES, shaped_store
from ..store.fields import decode_mask
from ..store.fields.keypoints import beyond_image
from ..store.formats import get_format
from ..store.location import read_manifest
from ..store.manifest import Manifest, ShardInfo, shard_path
from ..store.remote import access_error, fetch_shard, filesystem, is_url
from ..store.splitdirs import splits_error

__all__ = ["ShardProblem", "VerifyReport", "verify", "stored_values_problem"]


@dataclass(frozen=True)
class ShardProblem:
    file: str
    problem: str


@dataclass(frozen=True)
class VerifyReport:
    manifest: Manifest
    problems: tuple[ShardProblem, ...]
    checked_bytes: int
    quick: bool

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        m = self.manifest
        how = "sizes and headers" if self.quick else "sha256"
        if self.ok:
            return (
                f"ok: {len(m.shards)} shards, {m.num_samples} samples, "
                f"{self.checked_bytes / 1e6:.1f} MB checked ({how})"
            )
        lines = [f"{p.file}: {p.problem}" for p in self.problems]
        lines.append(f"{len(self.problems)} of {len(m.shards)} shards are bad ({how} checked)")
        return "\n".join(lines)


def _check_shard(root: Path, manifest: Manifest, info: ShardInfo, quick: bool) -> str | None:
    try:
        path = shard_path(root, info)
    except CacheError as exc:
        return str(exc)
    size = path_size(path)
    if size != info.bytes:
        return f"size {size} bytes, manifest says {info.bytes} (truncated or replaced)"
    if not quick:
        try:
            digest = sha256_path(path)
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"
        if digest != info.sha256:
            return "sha256 mismatch (the file's bytes changed)"
    try:
        store = manifest.format_options.get("store", "pixels")
        reader = get_format(manifest.format, reading=True).open(path, manifest.sample, info.samples, store)
    except CacheError as exc:
        return str(exc).removeprefix(f"{info.file}: ")
    try:
        if len(reader) != info.samples:
            return f"holds {len(reader)} samples, manifest says {info.samples}"
        if not quick:
            return stored_values_problem(manifest, info, reader)
    except CacheError as exc:
        return str(exc).removeprefix(f"{info.file}: ")
    finally:
        reader.close()
    return None


def _check_value(kind: str, value, classes: int, hw: tuple[int, int]) -> str | None:
    """What is wrong with one stored value, or None: class indices outside ``classes``, boxes that
    are not finite, have corners out of order or leave their image, crowd flags that are not 0 or 1."""
    found = value["classes"] if kind == "boxes" else value if kind == "labels" else None
    if found is not None and len(found) and (found.min() < 0 or found.max() >= classes):
        return f"a class outside the manifest's {classes}"
    if kind == "boxes" and len(value["boxes"]):
        b = value["boxes"]
        if not np.isfinite(b).all():
            return "a box that is not finite"
        if ((b[:, 2] < b[:, 0]) | (b[:, 3] < b[:, 1])).any():
            return "a box whose far corner comes before its near one (x2 < x1 or y2 < y1)"
        if (
            (b[:, 0] < -1).any()
            or (b[:, 1] < -1).any()
            or (b[:, 2] > hw[1] + 1).any()
            or (b[:, 3] > hw[0] + 1).any()
        ):
            return f"a box outside its {hw[1]}x{hw[0]} image"
        if (value["iscrowd"] > 1).any():
            return "an iscrowd flag that is not 0 or 1"
    if kind == "keypoints" and len(value) and beyond_image(value, hw[0], hw[1]).any():
        return f"a keypoint outside its {hw[1]}x{hw[0]} image"
    return None


def stored_values_problem(manifest: Manifest, info: ShardInfo, reader) -> str | None:
    """What is wrong with the values of an open shard, or None: its labels column within the
    classes, and every row of every field unpacks (offsets within their values, masks that decode
    to their image's size, text that is UTF-8, arrays of their shape, classes that index
    ``classes``, boxes inside their image, crowd flags 0 or 1). ``verify`` and ``convert`` both ask."""
    try:
        return _check_fields(manifest, info, reader)
    except CacheError as exc:
        return str(exc).removeprefix(f"{info.file}: ")


def _pixel_bytes_problem(manifest: Manifest, info: ShardInfo, reader) -> str | None:
    """A raw pixel store's rows against their recorded shapes: each row's byte count is its shape's,
    the offsets rise within the bytes, and a fixed-size cache's rows all have the manifest's shape."""
    store = manifest.format_options.get("store", "pixels")
    if store not in RAW_STORES or not (manifest.sample.ragged or shaped_store(store)) or not info.samples:
        return None
    shapes = np.asarray(reader.column("image_shape", slice(None))).astype(np.int64)
    offsets = np.asarray(reader.column("image_offsets", slice(None))).astype(np.int64)
    total = int(np.asarray(reader.column("image_bytes", slice(None))).size)
    if shapes.ndim != 2 or shapes.shape != (info.samples, 3) or offsets.shape != (info.samples + 1,):
        return f"{shapes.shape} shapes and {offsets.shape} offsets recorded for {info.samples} rows"
    spans = np.diff(offsets)
    small = np.flatnonzero((shapes[:, 1:] < 1).any(axis=1))
    if len(small):
        return f"row {int(small[0])} records a side below 1: {shapes[small[0]].tolist()}"
    bad = np.flatnonzero((spans != shapes.prod(axis=1)) | (shapes[:, 0] != manifest.sample.shape[0]))
    if len(bad):
        return f"row {int(bad[0])}: its {int(spans[bad[0]])} pixel bytes do not hold its shape {shapes[bad[0]].tolist()}"
    if offsets[0] != 0 or offsets[-1] != total:
        return f"the pixel offsets span {int(offsets[0])}..{int(offsets[-1])} of {total} bytes"
    if not manifest.sample.ragged:
        wrong = np.flatnonzero((shapes[:, 1:] != np.array(manifest.sample.shape[1:])).any(axis=1))
        if len(wrong):
            return f"row {int(wrong[0])} is {shapes[wrong[0]].tolist()}, the manifest says {list(manifest.sample.shape)}"
    return None


def _check_fields(manifest: Manifest, info: ShardInfo, reader) -> str | None:
    rows = list(range(info.samples))
    if manifest.sample.ragged:
        shapes = np.asarray(reader.column("image_shape", slice(None)))[:, 1:]
    else:
        shapes = np.tile(np.array(manifest.sample.shape[1:]), (info.samples, 1))
    problem = _pixel_bytes_problem(manifest, info, reader)
    if problem:
        return problem
    if info.samples:
        labels = np.asarray(reader.column("labels", slice(None)))
        if labels.min() < -1 or labels.max() >= len(manifest.classes):
            return f"a label outside -1 to {len(manifest.classes) - 1}"
    for name, spec in manifest.sample.fields.items():
        values = spec.handler.unpack(name, spec.params, reader.column, rows, info.samples)
        for row, value in zip(rows, values):
            if spec.kind == "mask":
                decode_mask(value, f"field {name!r}, row {row}", tuple(shapes[row]))
            problem = _check_value(spec.kind, value, len(manifest.classes), tuple(shapes[row]))
            if problem:
                return f"field {name!r}, row {row}: {problem}"
    return None


def verify(
    cache_dir: str | os.PathLike, *, quick: bool = False, storage_options: dict | None = None
) -> VerifyReport:
    """Check every shard of the cache (a folder or an fsspec URL); a broken manifest raises
    CacheError, bad shards are reported."""
    if is_url(cache_dir):
        return _verify_remote(str(cache_dir).rstrip("/"), quick, storage_options)
    root = Path(cache_dir)
    if (error := splits_error(root, "verify")) is not None:  # a folder of split caches: one at a time
        raise error
    manifest = read_manifest(root)
    problems = _index_problems(manifest, None if quick else root / manifest.index.get("file", ""))
    checked = 0
    for info in manifest.shards:
        problem = _check_shard(root, manifest, info, quick)
        if problem is None:
            checked += info.bytes
        else:
            problems.append(ShardProblem(info.file, problem))
    return VerifyReport(manifest, tuple(problems), checked, quick)


def _index_problems(manifest: Manifest, path: Path | None) -> list[ShardProblem]:
    """A format 5 cache's index against its record and its shards: its sha256 (``path``: the local
    file to hash; its size and layout were checked when it was mapped), each shard named once (a
    reader checks its shard's rows against the index's offsets, in ``_check_shard``)."""
    if not manifest.index:
        return []
    name, problems = manifest.index["file"], []
    if path is not None and sha256_path(path) != manifest.index["sha256"]:
        problems.append(ShardProblem(name, "sha256 mismatch (the index's bytes changed)"))
    names = manifest.shards.names()
    if len(set(names)) != len(names):
        problems.append(ShardProblem(name, "a shard file is listed twice"))
    return problems


def _remote_size(fs, path: str, url: str) -> int | None:
    try:
        if fs.isdir(path):
            return sum(fs.du(path, total=False).values())
        return int(fs.size(path))
    except FileNotFoundError:
        return None
    except Exception as exc:  # credentials, endpoint: the whole check stops, in one line
        raise access_error(url, exc, CacheError, "reach") from None


def _verify_remote(url: str, quick: bool, storage_options: dict | None) -> VerifyReport:
    manifest = read_manifest(url, storage_options=storage_options)  # its index fetched and hashed
    fs, root = filesystem(url, storage_options)
    problems, checked = _index_problems(manifest, None), 0
    with tempfile.TemporaryDirectory(prefix="cachekit-verify-") as tmp:
        folder = Path(tmp)
        for info in manifest.shards:
            remote = f"{root}/{info.file}"
            size = _remote_size(fs, remote, f"{url}/{info.file}")
            if size is None:
                problem = "missing"
            elif size != info.bytes:
                problem = f"size {size} bytes, manifest says {info.bytes} (truncated or replaced)"
            elif quick:
                problem = None
            else:
                problem = _fetch_and_check(fs, remote, folder, manifest, info)
            if problem is None:
                checked += info.bytes
            else:
                problems.append(ShardProblem(info.file, problem))
    return VerifyReport(manifest, tuple(problems), checked, quick)


def _fetch_and_check(fs, remote: str, folder: Path, manifest: Manifest, info: ShardInfo) -> str | None:
    local = folder / info.file
    try:
        fetch_shard(fs, remote, local)
    except Exception as exc:  # the filesystem's own error types too
        return f"cannot be fetched ({' '.join(str(exc).split())[:200] or type(exc).__name__})"
    try:
        return _check_shard(folder, manifest, info, quick=False)
    finally:
        remove_path(local)
