"""Human-readable summaries of caches, for ``cachekit info``."""

from __future__ import annotations

from .manifest import Manifest

__all__ = ["describe", "human_bytes"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def describe(m: Manifest) -> str:
    """A few lines a person reads to know what a cache holds."""
    c, h, w = m.sample.shape
    steps = ", ".join(
        s["op"] + "(" + ", ".join(f"{k}={v}" for k, v in s.items() if k != "op") + ")"
        for s in m.pipeline.get("steps", [])
    )
    classes = ", ".join(m.classes[:8]) + (f", ... ({len(m.classes)} in all)" if len(m.classes) > 8 else "")
    lines = [
        f"samples:   {m.num_samples} ({len(m.skipped)} inputs skipped)",
        f"sample:    uint8 [{c}, {h}, {w}] RGB, channels first ({human_bytes(m.sample.nbytes)} each)",
        f"format:    {m.format} ({', '.join(f'{k}={v}' for k, v in sorted(m.format_options.items()))})",
        f"shards:    {len(m.shards)}, {human_bytes(m.total_bytes)} in all",
        f"pipeline:  {m.pipeline.get('name')}: {steps or 'no steps'}",
        f"classes:   {classes or '(unlabelled)'}",
        "mean/std:  "
        + " ".join(f"{v:.4f}" for v in m.mean)
        + " / "
        + " ".join(f"{v:.4f}" for v in m.std)
        + "  (of pixels / 255)",
        f"source:    {m.source.get('root', '?')} ({m.source.get('layout', '?')}, {m.source.get('inputs', '?')} inputs)",
        f"built:     {m.created} by cachekit {m.cachekit_version}; fingerprint {m.fingerprint[:16]}",
    ]
    if m.skipped:
        lines.append("skipped:")
        lines += [f"  {s.path}: {s.reason}" for s in m.skipped[:10]]
        if len(m.skipped) > 10:
            lines.append(f"  ... and {len(m.skipped) - 10} more")
    return "\n".join(lines)
