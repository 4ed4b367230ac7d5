"""``manifest.json`` as text and as a file: parsed and bounded, read from a local folder, and the
text a manifest is written as (``location`` writes it, atomically, after its index)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..constants import MANIFEST_NAME
from ..errors import CacheError, NotACacheError
from .index import ShardIndex, check_record
from .limits import MAX_DEPTH, MAX_MANIFEST_BYTES, check_depth
from .manifest import Manifest
from .shardtable import ShardTable

__all__ = ["parse_manifest", "read_local_manifest", "manifest_text", "json_text"]


def parse_manifest(text: str, where: str, open_index: Callable[[dict], ShardIndex] | None = None) -> Manifest:
    """Validate the text of a ``manifest.json`` (``where`` names it in errors); a format 5
    manifest's shard index is mapped by ``open_index(record)``."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise CacheError(
            f"{where}: {len(text)} characters, over the {MAX_MANIFEST_BYTES} a manifest may have"
        )
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CacheError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:  # the decoder recurses once per bracket
        raise CacheError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise CacheError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict) or "format_version" not in obj:
        raise NotACacheError(f"{where}: not a cachekit manifest (no format_version)")
    check_depth(obj, where)
    shards = None
    if obj.get("format_version") == 5 and open_index is not None:
        shards = ShardTable(open_index(check_record(obj.get("index"), f"{where}: index")))
    return Manifest.from_json(obj, shards)


def read_local_manifest(cache_dir: str | os.PathLike) -> Manifest:
    """Read and validate ``cache_dir/manifest.json`` of a local folder; every problem is a CacheError.

    ``cachekit.read_manifest`` (in ``location``) also takes URLs and comes here for local paths.
    """
    root = Path(cache_dir)
    if not root.exists():
        raise NotACacheError(f"{root}: no such cache folder")
    if not root.is_dir():
        raise NotACacheError(f"{root}: not a folder")
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise NotACacheError(f"{root}: no {MANIFEST_NAME} (not a cache, or its build has not finished)")
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise CacheError(f"{path}: larger than the {MAX_MANIFEST_BYTES} bytes a manifest may have")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheError(f"{path}: cannot be read: {exc}") from None
    return parse_manifest(text, str(path), lambda record: ShardIndex(root / record["file"], record))


#: Lone surrogates U+DC80..U+DCFF: how Python (``os.fsdecode``) carries file-name bytes that are not UTF-8.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def json_text(obj: Any, **kwargs: Any) -> str:
    """JSON text that is valid UTF-8 even for file names that are not.

    Such a name's undecodable bytes reach Python as lone surrogates (``os.fsdecode``); each is
    written as its ``\\udcXX`` escape, which ``json.loads`` turns back into the same surrogate,
    so ``os.fsencode`` of the path read back gives the file name's original bytes.
    """
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    return _ESCAPED_BYTE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def manifest_text(manifest: Manifest) -> str:
    """The ``manifest.json`` text of ``manifest``."""
    return json_text(manifest.to_json(), indent=1) + "\n"
