"""A cache's manifest as JSON with its shards listed (format 4's form), for tests that edit it.

A format 5 cache keeps its shards in the binary index; a test that changes a shard's entry reads
the manifest in the listed form, edits it and writes it back: that writes a format 4 manifest,
which readers still accept, validated entry by entry as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from cachekit import read_manifest
from cachekit.store.atomic import sha256_path

__all__ = ["listed_manifest", "tampered_copy"]


def listed_manifest(cache: str | Path) -> dict:
    """``manifest.json`` of ``cache`` as an object with a ``shards`` list (format 4 if it was 5)."""
    obj = json.loads((Path(cache) / "manifest.json").read_text())
    if "index" in obj:
        obj["shards"] = [s.to_json() for s in read_manifest(cache).shards]
        for key in ("index", "num_shards", "total_bytes"):
            obj.pop(key, None)
        obj["format_version"] = 4
    return obj


def tampered_copy(cache: str | Path, copy: Path, change) -> Path:
    """A copy of a ``.pt`` ``cache`` at ``copy`` whose first shard's columns went through ``change``
    (a function editing the dict of columns in place), its size and checksum recomputed: what a
    reader meets when a shard was altered by someone who also fixed the manifest."""
    shutil.copytree(cache, copy)
    manifest = listed_manifest(copy)
    info = manifest["shards"][0]
    path = copy / info["file"]
    columns = torch.load(path, weights_only=True)
    change(columns)
    torch.save(columns, path)
    info["bytes"], info["sha256"] = path.stat().st_size, sha256_path(path)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy
