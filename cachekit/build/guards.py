"""What a build refuses before it writes anything, each in one line a user can act on.

Bad options; RAW and ``--out`` the same folder or one inside the other (a build must never write
into its inputs, nor an ``--overwrite`` remove them); an ``--out`` holding a cache of other options
(named), a cache whose inputs changed (``--update``), an older or damaged cache, an unfinished
build of something else, or files that are not a cache (``--overwrite``).
"""

from __future__ import annotations

import os

from ..constants import MAX_AUGMENT, MAX_JOB_BYTES, MAX_SHARD_SAMPLES, MAX_SIDE
from ..errors import UsageError
from ..store.location import Location
from ..store.manifest import ORDERS, Manifest
from ..store.remote import is_url
from .config import BuildConfig
from .resume import Partial
from .retire import is_own_record

__all__ = ["check_apart", "check_config", "check_job_bytes", "refuse"]


def _local_path(location: str | os.PathLike) -> str | None:
    """The absolute real path of a local folder (``file://`` URLs included); None for other URLs."""
    text = os.fspath(location)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif is_url(text):
        return None
    return os.path.realpath(text)


def check_apart(
    raw: str | os.PathLike, out: str | os.PathLike, names: tuple[str, str] = ("RAW", "--out")
) -> None:
    """Refuse ``out`` equal to ``raw``, inside it, or holding it: a build never writes into its inputs."""
    a, b = _local_path(raw), _local_path(out)
    sep = os.sep
    if a is None or b is None:
        if (a is None) != (b is None):
            return  # one local, one remote: apart
        a, b, sep = os.fspath(raw).rstrip("/"), os.fspath(out).rstrip("/"), "/"
    what, where = names
    if a == b:
        raise UsageError(f"{where} {out} is {what} itself; write to another folder")
    if b.startswith(a.rstrip(sep) + sep):
        raise UsageError(f"{where} {out} is inside {what} {raw}; write to a folder outside it")
    if a.startswith(b.rstrip(sep) + sep):
        raise UsageError(f"{what} {raw} is inside {where} {out}; write to a folder beside it")


def check_config(config: BuildConfig) -> None:
    """Refuse options no build can honour, before anything is read or allocated."""
    if config.update and config.overwrite:
        raise UsageError(
            "--update and --overwrite contradict each other (keep the cache's shards, or replace "
            "them all): give one"
        )
    if config.size is not None and (
        isinstance(config.size, bool) or not isinstance(config.size, int) or not 1 <= config.size <= MAX_SIDE
    ):
        raise UsageError(f"--size must be from 1 to {MAX_SIDE} pixels, got {config.size}")
    if not 0 <= config.augment <= MAX_AUGMENT:
        raise UsageError(
            f"--augment must be from 0 to {MAX_AUGMENT} variants per input, got {config.augment}"
        )
    if config.shard_size is not None and not 1 <= config.shard_size <= MAX_SHARD_SAMPLES:
        raise UsageError(f"--shard-size must be between 1 and {MAX_SHARD_SAMPLES}")
    if config.workers is not None and config.workers < 1:
        raise UsageError("--workers must be at least 1")
    if config.order not in ORDERS:
        raise UsageError(f"--order must be one of {', '.join(ORDERS)}, got {config.order!r}")
    if config.shards is not None and config.shards < 1:
        raise UsageError("--shards must be at least 1")
    if config.shards is not None and config.order != "shuffled":
        raise UsageError("--shards is the shard count of --order shuffled; sorted caches use --shard-size")
    if config.max_pixels < 0:
        raise UsageError("--max-pixels must be >= 0 (0: no limit)")
    if config.grace is not None and config.grace < 0:
        raise UsageError("--grace must be >= 0")
    if not (isinstance(config.min_visibility, (int, float)) and 0.0 <= config.min_visibility <= 1.0):
        raise UsageError(f"--min-visibility must be between 0 and 1, got {config.min_visibility!r}")


def check_job_bytes(shard_size: int, variants: int, sample_bytes: int) -> None:
    """Refuse a layout whose shard jobs would each hold more decoded pixels than ``MAX_JOB_BYTES``."""
    need = shard_size * variants * sample_bytes
    if need > MAX_JOB_BYTES:
        what = f"{shard_size} inputs" + (f" x {variants} variants" if variants > 1 else "")
        raise UsageError(
            f"a shard of {what} x {sample_bytes} bytes a sample is {need / 2**30:.1f} GiB of pixels in "
            f"each worker's memory, over the limit of {MAX_JOB_BYTES // 2**30} GiB: give a smaller "
            "--shard-size" + (", fewer --augment variants" if variants > 1 else "") + " or a smaller --size"
        )


def refuse(
    out: Location,
    raw: str | os.PathLike,
    inputs: int,
    config: BuildConfig,
    previous: Manifest | None,
    text: str | None,
    changes: list[str],
    fingerprint: str,
    partial: Partial | None,
) -> None:
    """Raise UsageError when ``out`` holds something this build may not replace without a flag.

    ``previous``/``text``: the cache there (None when its manifest does not validate, with the
    text it has); ``changes``: the options that differ from it, in words; ``inputs``: how many now.
    """
    if config.overwrite or (partial is not None and partial.fingerprint == fingerprint):
        return  # (an unfinished build of another fingerprint is resumed as far as its shards fit)
    if previous is not None:
        if changes:
            flag = (
                "--update cannot change options"
                if config.update
                else f"--out {out.url} holds a cache built with other options"
            )
            raise UsageError(f"{flag} ({', '.join(changes)}); pass --overwrite to rebuild it")
        if previous.fingerprint != fingerprint and not config.update:
            then, now = previous.source.get("inputs"), inputs
            raise UsageError(
                f"the inputs under {raw} changed since {out.url} was built ({then} then, {now} now); "
                "pass --update to rebuild only the shards they touch, or --overwrite"
            )
        return
    if text is not None:
        raise UsageError(
            f"--out {out.url} holds a cache this version of cachekit cannot update (an older format, or "
            "damaged); pass --overwrite to rebuild it"
        )
    if partial is not None:
        if config.update:
            return
        raise UsageError(
            f"--out {out.url} holds an unfinished build of other options or inputs: re-run the command "
            "that started it, pass --update to go on with these inputs and options (its finished shards "
            "that fit are kept), or --overwrite"
        )
    if any(not is_own_record(name) for name in out.names()):
        if config.update:
            raise UsageError(f"--update: {out.url} holds no cache to update (use --overwrite to build there)")
        raise UsageError(
            f"--out {out.url} is not empty (it holds files that are not a cache); pass --overwrite to build there"
        )
