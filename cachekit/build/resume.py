"""An unfinished build's records in ``--out``, so that re-running the same command resumes it.

Before its first shard job a build writes ``PARTIAL_DIR/state.json``: its fingerprint and every
shard it plans. Each finished shard then gets a small JSON sidecar (its ``ShardInfo`` and skips).
A re-run with the same fingerprint reuses the finished shards; a build of other options (with
``--overwrite``) removes the planned shards no manifest references: they are recorded, hence ours.
Only shard file names count as recorded (``retire.recorded_names``): a record naming anything else
is ignored with a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..constants import MANIFEST_NAME, PARTIAL_DIR
from ..errors import BuildError, CacheError
from ..store.location import Location, write_failure
from ..store.manifest import Manifest, ShardInfo, SkippedInput
from ..store.manifestio import json_text, parse_manifest
from .retire import recorded_names
from .shardjob import ShardResult

__all__ = ["Partial", "read_partial", "start_partial", "write_sidecar", "existing_cache", "reusable"]


@dataclass(frozen=True)
class Partial:
    """What an unfinished build recorded: its fingerprint, its planned shards, the finished ones."""

    fingerprint: str
    planned: tuple[str, ...]
    finished: dict[str, tuple[ShardInfo, tuple[SkippedInput, ...]]]
    layout: dict | None = None  # {"order": ..., "shard_size": ...} it planned with
    #: A stream's finished shards: the digest of the samples each was built from (``samples_digest``).
    samples: dict[str, str] = field(default_factory=dict)


def reusable(out: Location, info: ShardInfo | None, verify: bool) -> bool:
    """True when ``info``'s shard is in ``out`` with its size (and, with ``verify``, its sha256)."""
    if info is None or out.size(info.file) != info.bytes:
        return False
    return not verify or out.sha256(info.file) == info.sha256


def read_partial(out: Location) -> Partial | None:
    """The records of an unfinished build in ``out``, or None when there are none."""
    try:
        state = json.loads(out.read_text(f"{PARTIAL_DIR}/state.json") or "")
    except ValueError:
        return None
    if not isinstance(state, dict) or not isinstance(state.get("fingerprint"), str):
        return None
    listed = state.get("planned")
    planned = recorded_names(
        listed if isinstance(listed, list) else [], f"{out.url}/{PARTIAL_DIR}/state.json"
    )
    finished, samples = {}, {}
    for name in out.names(PARTIAL_DIR):
        if name == "state.json" or not name.endswith(".json"):
            continue
        try:
            obj = json.loads(out.read_text(f"{PARTIAL_DIR}/{name}") or "")
            info = ShardInfo.from_json(obj["info"], name, len(obj["info"]["pixel_sum"]))
            skipped = tuple(SkippedInput.from_json(s, name) for s in obj["skipped"])
        except (ValueError, KeyError, TypeError, CacheError):
            continue
        if info.file in planned and name == f"{info.file}.json":
            finished[info.file] = (info, skipped)
            if isinstance(obj.get("samples"), str):
                samples[info.file] = obj["samples"]
    layout = state.get("layout") if isinstance(state.get("layout"), dict) else None
    return Partial(state["fingerprint"], tuple(planned), finished, layout, samples)


def start_partial(out: Location, fingerprint: str, planned: list[str], layout: dict | None = None) -> None:
    """Record, before any shard is written, that this build plans ``planned`` (cut with ``layout``)."""
    state = {"fingerprint": fingerprint, "planned": planned}
    if layout is not None:
        state["layout"] = layout
    try:
        out.mkdir(PARTIAL_DIR)
        out.write_text(f"{PARTIAL_DIR}/state.json", json_text(state))
    except OSError as exc:
        raise BuildError(f"cannot write to {out.url}: {write_failure(exc)}") from None


def write_sidecar(out: Location, result: ShardResult, samples: str | None = None) -> None:
    """Record a finished shard; ``samples``: the digest of a stream's samples it holds (kept when the
    shard is recorded again without one)."""
    obj = {"info": result.info.to_json(), "skipped": [s.to_json() for s in result.skipped]}
    if samples is None:
        samples = _recorded_samples(out, result.info.file)
    if samples is not None:
        obj["samples"] = samples
    try:
        out.write_text(f"{PARTIAL_DIR}/{result.info.file}.json", json_text(obj))
    except OSError as exc:
        raise BuildError(f"cannot write to {out.url}: {write_failure(exc)}") from None


def _recorded_samples(out: Location, file: str) -> str | None:
    try:
        obj = json.loads(out.read_text(f"{PARTIAL_DIR}/{file}.json") or "")
    except ValueError:
        return None
    found = obj.get("samples") if isinstance(obj, dict) else None
    return found if isinstance(found, str) else None


def existing_cache(out: Location) -> tuple[Manifest | None, str | None]:
    """The cache in ``out``: its manifest if it validates, and the manifest's text (or None)."""
    text = out.read_text(MANIFEST_NAME)
    if text is None:
        return None, None
    try:
        return parse_manifest(text, f"{out.url}/{MANIFEST_NAME}", out.open_index), text
    except CacheError:
        return None, text
