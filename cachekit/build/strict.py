"""What a build left out, and when that stops it once its shards are written: every skipped input
(discovery's, then each shard's), the refusal of a ``--strict`` build (one short line, with how many
inputs and annotations were left out, the first few of them with their reasons, each cut short, and
how to see every one), and a build none of whose inputs could be decoded."""

from __future__ import annotations

from ..errors import BuildError, UsageError
from ..store.manifest import ShardInfo, SkippedInput
from .shardjob import ShardResult
from .sources.inputtable import Source

__all__ = ["SHOWN", "strict_refusal", "skipped_inputs", "finished_refusal"]

#: Problems a refusal shows; the rest are counted.
SHOWN = 5
#: The longest path (cut in the middle) and reason (its head kept) shown.
_PATH_CHARS = 48
_REASON_CHARS = 64


def _cut(text: str, most: int, middle: bool) -> str:
    """``text`` on one line, at most ``most`` characters: ``...`` for its middle (a path: its folder
    and its file name kept) or its end (a reason)."""
    text = " ".join(str(text).split())
    if len(text) <= most:
        return text
    if middle:
        head = (most - 3) // 2
        return text[:head] + "..." + text[len(text) - (most - 3 - head) :]
    return text[: most - 3] + "..."


def strict_refusal(skipped: list[tuple[str, str]], dropped: list[tuple[str, str]], out: str) -> str:
    """The line a ``--strict`` build of ``out`` stops with: ``skipped`` inputs and ``dropped``
    annotations, each ``(path, reason)``, counted, the first ``SHOWN`` of them (by path, inputs first) shown."""
    problems = [*sorted(skipped), *sorted(dropped)]
    shown = "; ".join(
        f"{_cut(path, _PATH_CHARS, True)}: {_cut(reason, _REASON_CHARS, False)}"
        for path, reason in problems[:SHOWN]
    )
    counts = f"{len(skipped)} inputs could not be used and {len(dropped)} annotations were left out"
    more = f" (the first {SHOWN} of {len(problems)})" if len(problems) > SHOWN else ""
    return (
        f"--strict: {counts}: {shown}{more}; a build without --strict lists them all in its manifest "
        f"(cachekit info {out})"
    )


def skipped_inputs(source: Source, results: list[ShardResult]) -> list[SkippedInput]:
    """Every input a build leaves out: discovery's (``source.ignored``), then each shard's, in order."""
    skipped = [SkippedInput(p, r) for p, r in source.ignored]
    for result in results:
        skipped.extend(result.skipped)
    return skipped


def finished_refusal(
    strict: bool, skipped: list[SkippedInput], source: Source, shards: list[ShardInfo], raw, out: str
) -> Exception | None:
    """Why a build whose shards are written writes no manifest: ``strict`` and an input or annotation
    left out (``BuildError``), or no input decoded at all (``UsageError``); None when it writes one."""
    if strict and (skipped or source.dropped):
        problems = [(s.path, s.reason) for s in skipped]
        return BuildError(strict_refusal(problems, list(source.dropped), out))
    if sum(s.samples for s in shards) == 0:
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:3])
        return UsageError(f"{raw}: none of the {len(source)} inputs could be decoded ({reasons})")
    return None
