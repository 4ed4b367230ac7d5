"""A cache's manifest as JSON with its shards listed (format 4's form), for tests that edit it.

A format 5 cache keeps its shards in the binary index; a test that changes a shard's entry reads
the manifest in the listed form, edits it and writes it back: that writes a format 4 manifest,
which readers still accept, validated entry by entry as before.
"""

from __future__ import annotations

import json
from pathlib import Path

from cachekit import read_manifest

__all__ = ["listed_manifest"]


def listed_manifest(cache: str | Path) -> dict:
    """``manifest.json`` of ``cache`` as an object with a ``shards`` list (format 4 if it was 5)."""
    obj = json.loads((Path(cache) / "manifest.json").read_text())
    if "index" in obj:
        obj["shards"] = [s.to_json() for s in read_manifest(cache).shards]
        for key in ("index", "num_shards", "total_bytes"):
            obj.pop(key, None)
        obj["format_version"] = 4
    return obj
