"""What a build finds in ``--out`` and leaves there: a finished cache, an interrupted build's records.

A build records each finished shard in ``PARTIAL_DIR`` (a small JSON sidecar) so that a re-run of
the same command resumes; a folder holding anything else needs ``--overwrite``. Only cachekit's own
files (``shard-*`` and hidden ``*.tmp``) are ever deleted.
"""

from __future__ import annotations

import json

from ..constants import LOCK_NAME, MANIFEST_NAME, PARTIAL_DIR
from ..errors import CacheError, UsageError
from ..store.location import Location
from ..store.manifest import Manifest, ShardInfo, SkippedInput, parse_manifest
from .shardjob import ShardResult

__all__ = ["reusable", "read_sidecars", "write_sidecar", "existing_cache", "remove_unreferenced", "check_out"]


def reusable(out: Location, info: ShardInfo | None, verify: bool) -> bool:
    """True when ``info``'s shard is in ``out`` with its size (and, with ``verify``, its sha256)."""
    if info is None or out.size(info.file) != info.bytes:
        return False
    return not verify or out.sha256(info.file) == info.sha256


def read_sidecars(
    out: Location, fingerprint: str
) -> dict[str, tuple[ShardInfo, tuple[SkippedInput, ...]]] | None:
    """Finished shards recorded by an interrupted build with the same fingerprint.

    None when ``out`` records no interrupted build of this fingerprint; an empty dict when one was
    interrupted before it finished any shard (it still resumes, into the same folder).
    """
    try:
        state = json.loads(out.read_text(f"{PARTIAL_DIR}/state.json") or "")
    except ValueError:
        return None
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        return None
    found = {}
    for name in out.names(PARTIAL_DIR):
        if name == "state.json" or not name.endswith(".json"):
            continue
        try:
            obj = json.loads(out.read_text(f"{PARTIAL_DIR}/{name}") or "")
            info = ShardInfo.from_json(obj["info"], name, len(obj["info"]["pixel_sum"]))
            skipped = tuple(SkippedInput.from_json(s, name) for s in obj["skipped"])
        except (ValueError, KeyError, TypeError, CacheError):
            continue
        found[info.file] = (info, skipped)
    return found


def write_sidecar(out: Location, result: ShardResult) -> None:
    obj = {"info": result.info.to_json(), "skipped": [s.to_json() for s in result.skipped]}
    out.write_text(f"{PARTIAL_DIR}/{result.info.file}.json", json.dumps(obj))


def existing_cache(out: Location) -> Manifest | None:
    text = out.read_text(MANIFEST_NAME)
    if text is None:
        return None
    try:
        return parse_manifest(text, f"{out.url}/{MANIFEST_NAME}")
    except CacheError:
        return None


def _is_ours(name: str) -> bool:
    return name.startswith("shard-") or (name.startswith(".") and name.endswith(".tmp"))


def remove_unreferenced(out: Location, manifest: Manifest | None) -> None:
    """Delete cachekit's own files that ``manifest`` does not reference (never a user's files)."""
    keep = {s.file for s in manifest.shards} if manifest is not None else set()
    for name in out.names():
        if _is_ours(name) and name not in keep:
            out.remove(name)
    out.remove(PARTIAL_DIR)


def check_out(out: Location, config, previous: Manifest | None, resumable: bool) -> None:
    """Refuse an ``--out`` that holds something this build may not replace (``config``: a BuildConfig)."""
    if not out.exists():
        return
    contents = [name for name in out.names() if name != LOCK_NAME]
    if not contents or config.overwrite or resumable or (config.update and previous is not None):
        return
    if config.update:
        raise UsageError(f"--update: {out.url} holds no valid cache to update (use --overwrite to rebuild)")
    what = "a different cache" if previous is not None else "files that are not this build's"
    raise UsageError(f"--out {out.url} is not empty (it holds {what}); pass --overwrite to replace it")
