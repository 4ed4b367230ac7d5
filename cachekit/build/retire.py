"""What a build may remove from ``--out``, and when: only what the cache recorded, never too early.

The rules, in the order a build applies them:

- cachekit deletes only files it recorded itself: shards a manifest names, shards in the retired
  record (``.cachekit-retired.json``), shards an unfinished build planned (``.cachekit-partial/``),
  those records, and its own temp files (``.NAME.PID.tmp``). A user's ``shard-000000.tar`` or
  ``shard-userfolder/`` is never touched, whatever it is called.
- A shard the previous manifest referenced is **retired**, not deleted, when the new manifest
  stops referencing it (``--update``, ``--overwrite``): a reader that opened the previous version
  opens its shards lazily, and must be able to finish its epoch. The retired record is written
  before the new manifest, so a crash in between loses nothing.
- A later build (any run of ``cachekit build`` on the folder, "up to date" included) removes the
  retired shards that have been retired for at least the grace period (``--grace``, default 24
  hours; ``--grace 0`` removes them at the end of the build that retires them).
- Files no manifest ever referenced (shards of an interrupted build that will not be resumed,
  temp files of killed workers) no reader can hold: they are removed at once.

Records are data, never commands: every name read from a record (retired shards, an unfinished
build's plan and finished shards, a damaged manifest's shards) must be a shard file name a build
writes (``shard-<hex>.<pt|h5|zarr>``); anything else (``manifest.json``, a user's file, a path) is
ignored with a warning, and a shard the current manifest references is never removed.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Iterable

from ..constants import LOCK_NAME, MANIFEST_NAME, PARTIAL_DIR, RETIRED_NAME
from ..errors import BuildError
from ..store.limits import short
from ..store.location import Location, write_failure
from ..store.manifestio import json_text

__all__ = [
    "is_shard_name",
    "recorded_names",
    "recorded_shards",
    "read_retired",
    "retire",
    "collect",
    "remove_temps",
    "remove_unrecorded_plan",
    "is_temp",
    "is_own_record",
]

log = logging.getLogger("cachekit")

#: The name of a shard file a build or a conversion writes: a content key of hex digits and the
#: extension of one of the formats (``shardplan``, ``convert``).
#: A format 5 cache's shard index (``index-<hex>.bin``) is retired and removed the same way.
_SHARD_FILE = re.compile(r"^(?:shard-[0-9a-f]{6,64}\.(?:pt|h5|zarr)|index-[0-9a-f]{16}\.bin)$")

#: ``atomic.temp_name``: a hidden sibling ``.NAME.PID.tmp`` of a file being committed.
#: Exactly those names (a shard's is ``shard-<hex>.<pt|h5|zarr>``): a user's ``.shard-notes.tmp`` is not one.
_TEMP = re.compile(
    r"^\.(?:shard-[0-9a-f]{6,64}\.(?:pt|h5|zarr)|index-[0-9a-f]{16}\.bin|manifest\.json|"
    + re.escape(RETIRED_NAME)
    + r")\.\d+\.tmp$"
)


def is_own_record(name: str) -> bool:
    """True for the files cachekit keeps beside a cache's shards (lock, records, temp files)."""
    return name in (LOCK_NAME, RETIRED_NAME, PARTIAL_DIR) or is_temp(name)


def is_temp(name: str) -> bool:
    """True for a temp file cachekit writes while committing a shard, the manifest or a record."""
    return bool(_TEMP.match(name))


def is_shard_name(name: object) -> bool:
    """True for the name of a shard file a build writes (``shard-<hex>.pt``, ``.h5``, ``.zarr``)."""
    return isinstance(name, str) and bool(_SHARD_FILE.match(name))


def recorded_names(names: Iterable[object], where: str) -> list[str]:
    """The entries of ``names``, read from the record ``where``, that are shard file names; the
    others are ignored with one warning (a record is data: it never names what a build removes)."""
    found, ignored = [], []
    for name in names:
        (found if is_shard_name(name) else ignored).append(name)
    if ignored:
        shown = ", ".join(short(n) for n in ignored[:3]) + (
            f" and {len(ignored) - 3} more" if len(ignored) > 3 else ""
        )
        log.warning("%s: ignored %d entries that are not shard file names: %s", where, len(ignored), shown)
    return found


def recorded_shards(text: str | None) -> set[str]:
    """The shard files a manifest's text names, read leniently (any format version, even damaged).

    Used to know what an ``--overwrite`` may retire when the manifest no longer validates (a cache
    of an older format); only plain shard names count, so nothing outside the folder is named.
    """
    if not text:
        return set()
    try:
        obj = json.loads(text)
    except ValueError:
        return set()
    shards = obj.get("shards") if isinstance(obj, dict) else None
    files = [entry.get("file") if isinstance(entry, dict) else None for entry in shards or ()]
    files = files if isinstance(shards, list) else []
    index = obj.get("index") if isinstance(obj, dict) else None
    if isinstance(index, dict):  # format 5: its shards are in the index, named there alone
        files.append(index.get("file"))
    return set(recorded_names(files, f"{MANIFEST_NAME} (damaged)"))


def read_retired(out: Location) -> dict[str, float]:
    """The retired record: shard name -> when it was retired (Unix seconds)."""
    try:
        obj = json.loads(out.read_text(RETIRED_NAME) or "{}")
    except ValueError:
        return {}
    files = obj.get("files") if isinstance(obj, dict) else None
    files = files if isinstance(files, dict) else {}
    found = {}
    for name in recorded_names(files, f"{out.url}/{RETIRED_NAME}"):
        since = files[name]
        if isinstance(since, (int, float)) and not isinstance(since, bool) and math.isfinite(since):
            found[name] = float(since)
    return found


def _write_retired(out: Location, retired: dict[str, float]) -> None:
    try:
        if retired:
            out.write_text(RETIRED_NAME, json_text({"files": dict(sorted(retired.items()))}, indent=1) + "\n")
        else:
            out.remove(RETIRED_NAME)
    except OSError as exc:
        raise BuildError(f"cannot write {out.url}/{RETIRED_NAME}: {write_failure(exc)}") from None


def retire(out: Location, previous: Iterable[str], current: Iterable[str], now: float | None = None) -> int:
    """Record ``previous`` shards that ``current`` (the manifest about to be written) drops.

    Called before the new manifest is written. A shard ``current`` references again leaves the
    record. Returns how many shards the record now holds.
    """
    now = time.time() if now is None else now
    current = set(current)
    retired = {name: since for name, since in read_retired(out).items() if name not in current}
    for name in set(previous) - current:
        retired.setdefault(name, now)
    _write_retired(out, retired)
    return len(retired)


def collect(out: Location, referenced: Iterable[str], grace: float, now: float | None = None) -> list[str]:
    """Remove retired shards past ``grace`` seconds that the current manifest does not reference."""
    now = time.time() if now is None else now
    referenced = set(referenced)
    retired = read_retired(out)
    removed = []
    for name, since in sorted(retired.items()):
        if name in referenced:
            del retired[name]
        elif now - since >= grace:
            out.remove(name)
            del retired[name]
            removed.append(name)
    if removed or set(read_retired(out)) != set(retired):
        _write_retired(out, retired)
    return removed


def remove_temps(out: Location) -> None:
    """Remove cachekit's temp files (only ever orphans while this build holds the lock)."""
    for name in out.names():
        if is_temp(name):
            out.remove(name)


def remove_unrecorded_plan(out: Location, planned: Iterable[str], keep: Iterable[str]) -> None:
    """Remove shards an unfinished build planned that no manifest references, then its records.

    ``keep``: the shards of the manifest in place; retired shards are kept too (the same content
    may have been planned again while an older version's reader still holds it). The shards that
    the records' sidecars name count as planned (a records folder whose plan was lost: a kill
    while it was being removed). Records go one by one, the plan last, so a kill at any point
    leaves records a later run reads and removes again.
    """
    records = [n for n in out.names(PARTIAL_DIR) if n != "state.json"]
    sidecars = [n[: -len(".json")] for n in records if n.endswith(".json")]
    keep = set(keep) | set(read_retired(out))
    for name in set(recorded_names(planned, f"{out.url}/{PARTIAL_DIR}")) | set(
        recorded_names(sidecars, f"{out.url}/{PARTIAL_DIR}")
    ):
        if name not in keep:
            out.remove(name)
    for name in records:
        out.remove(f"{PARTIAL_DIR}/{name}")
    out.remove(f"{PARTIAL_DIR}/state.json")
    out.remove(PARTIAL_DIR)
