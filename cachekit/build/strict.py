"""The refusal of a ``--strict`` build: one short line, with how many inputs and annotations were left
out, the first few of them with their reasons (each cut short), and how to see every one."""

from __future__ import annotations

__all__ = ["SHOWN", "strict_refusal"]

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
