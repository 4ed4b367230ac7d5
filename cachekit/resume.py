"""What a build finds in ``--out`` and leaves there: a finished cache, an interrupted build's records.

A build records each finished shard in ``PARTIAL_DIR`` (a small JSON sidecar) so that a re-run of
the same command resumes; a folder holding anything else needs ``--overwrite``. Only cachekit's own
files (``shard-*`` and hidden ``*.tmp``) are ever deleted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .atomic import commit_file, path_size, remove_path, sha256_path
from .constants import LOCK_NAME, PARTIAL_DIR
from .errors import CacheError, UsageError
from .manifest import Manifest, ShardInfo, SkippedInput, read_manifest
from .shardjob import ShardResult

__all__ = ["reusable", "read_sidecars", "write_sidecar", "existing_cache", "remove_unreferenced", "check_out"]


def reusable(out: Path, info: ShardInfo | None, verify: bool) -> bool:
    """True when ``info``'s shard is in ``out`` with its size (and, with ``verify``, its sha256)."""
    if info is None:
        return False
    path = out / info.file
    try:
        if path_size(path) != info.bytes:
            return False
    except OSError:
        return False
    return not verify or sha256_path(path) == info.sha256


def read_sidecars(
    partial: Path, fingerprint: str
) -> dict[str, tuple[ShardInfo, tuple[SkippedInput, ...]]] | None:
    """Finished shards recorded by an interrupted build with the same fingerprint.

    None when ``partial`` records no interrupted build of this fingerprint; an empty dict when
    one was interrupted before it finished any shard (it still resumes, into the same folder).
    """
    try:
        state = json.loads((partial / "state.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        return None
    found = {}
    for f in sorted(partial.glob("*.json")):
        if f.name == "state.json":
            continue
        try:
            obj = json.loads(f.read_text())
            info = ShardInfo.from_json(obj["info"], f.name, len(obj["info"]["pixel_sum"]))
            skipped = tuple(SkippedInput.from_json(s, f.name) for s in obj["skipped"])
        except (OSError, ValueError, KeyError, TypeError, CacheError):
            continue
        found[info.file] = (info, skipped)
    return found


def write_sidecar(partial: Path, result: ShardResult) -> None:
    obj = {"info": result.info.to_json(), "skipped": [s.to_json() for s in result.skipped]}
    data = json.dumps(obj)
    commit_file(partial / f"{result.info.file}.json", lambda tmp: tmp.write_text(data))


def existing_cache(out: Path) -> Manifest | None:
    try:
        return read_manifest(out)
    except CacheError:
        return None


def _is_ours(name: str) -> bool:
    return name.startswith("shard-") or (name.startswith(".") and name.endswith(".tmp"))


def remove_unreferenced(out: Path, manifest: Manifest | None) -> None:
    """Delete cachekit's own files that ``manifest`` does not reference (never a user's files)."""
    keep = {s.file for s in manifest.shards} if manifest is not None else set()
    for entry in out.iterdir():
        if _is_ours(entry.name) and entry.name not in keep and not entry.is_symlink():
            remove_path(entry)
    shutil.rmtree(out / PARTIAL_DIR, ignore_errors=True)


def check_out(out: Path, config, previous: Manifest | None, resumable: bool) -> None:
    """Refuse an ``--out`` that holds something this build may not replace (``config``: a BuildConfig)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    if not out.exists():
        return
    contents = [p for p in out.iterdir() if p.name != LOCK_NAME]
    if not contents or config.overwrite or resumable or (config.update and previous is not None):
        return
    if config.update:
        raise UsageError(f"--update: {out} holds no valid cache to update (use --overwrite to rebuild)")
    what = "a different cache" if previous is not None else "files that are not this build's"
    raise UsageError(f"--out {out} is not empty (it holds {what}); pass --overwrite to replace it")
