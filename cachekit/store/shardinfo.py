"""One shard's entry in a manifest (``ShardInfo``: its file, counts, size, checksums and what it was
built from), read from JSON with every field checked, and the shard's path in its cache folder
(``shard_path``: a regular file or a folder of them, no links)."""

from __future__ import annotations

import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import CacheError
from .jsonfields import get, get_floats, get_int, get_str
from .limits import MAX_SHARD_BYTES, MAX_SHARD_ROWS
from .shardfiles import check_plain_tree, check_shard_name

__all__ = ["ShardInfo", "shard_path"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: how many samples it holds, how big it is, and what it was built from."""

    file: str
    samples: int
    bytes: int
    sha256: str
    inputs: int
    first: str
    last: str
    inputs_digest: str
    pixel_sum: tuple[float, ...]
    pixel_sumsq: tuple[float, ...]
    pixel_count: int  # pixels per channel the sums cover

    def to_json(self) -> dict:
        out = asdict(self)
        out["pixel_sum"] = list(self.pixel_sum)
        out["pixel_sumsq"] = list(self.pixel_sumsq)
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str, channels: int = 3) -> ShardInfo:
        sha = get_str(obj, "sha256", where)
        digest = get_str(obj, "inputs_digest", where)
        for key, value in (("sha256", sha), ("inputs_digest", digest)):
            if not _HEX64.fullmatch(value):
                raise CacheError(f"{where}.{key}: expected 64 lowercase hex digits, got {value!r}")
        info = cls(
            file=check_shard_name(get(obj, "file", where), f"{where}.file"),
            samples=get_int(obj, "samples", where, maximum=MAX_SHARD_ROWS),
            bytes=get_int(obj, "bytes", where, minimum=1, maximum=MAX_SHARD_BYTES),
            sha256=sha,
            inputs=get_int(obj, "inputs", where, minimum=1, maximum=MAX_SHARD_ROWS),
            first=get_str(obj, "first", where),
            last=get_str(obj, "last", where),
            inputs_digest=digest,
            pixel_sum=get_floats(obj, "pixel_sum", where, channels),
            pixel_sumsq=get_floats(obj, "pixel_sumsq", where, channels),
            pixel_count=get_int(obj, "pixel_count", where),
        )
        return info


def shard_path(root: Path, info: ShardInfo) -> Path:
    """The shard's path, refusing anything but a regular file or folder of files inside ``root``."""
    path = root / info.file
    if path.is_symlink() and path.resolve().parent != root.resolve():
        raise CacheError("is a symlink out of the cache folder")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise CacheError("missing") from None
    except OSError as exc:
        raise CacheError(f"cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        check_plain_tree(path)
    elif not stat.S_ISREG(mode):
        raise CacheError("not a regular file or folder")
    return path
