"""The picture of a ``cachekit doctor`` run: each timed step's wait for data against its compute, over time.

What the practice says to watch, drawn from the run's own figures: the top panel puts every timed
step where it happened in time, its compute (blue) with its wait for data (red) stacked on it, so
a loader that falls behind shows as red, and one whose supply runs dry every few batches (a
worker pool refilling) as red spikes at a regular spacing, marked and counted; the bottom panel is
the same steps as a strip of waiting and computing, with the GPU's utilisation over it where NVML
measured it. The verdict (data keeps up, or a data bottleneck, by ``advice.STALL_OK``) is written
on the picture in its colour. matplotlib is optional (``benchview.require_matplotlib``).
"""

from __future__ import annotations

import errno
import os
import statistics
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..constants import DIST_NAME
from ..errors import CachekitError
from .advice import STALL_OK
from .benchview import require_matplotlib

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from .doctor import DoctorReport

__all__ = ["WAIT_LABEL", "STEP_LABEL", "StallPattern", "stall_pattern", "doctor_figure", "plot_report"]

#: The legend's words, and the labels of the top panel's two bar series (tests find them by these).
WAIT_LABEL = "waiting for data"
STEP_LABEL = "step (compute)"
WAIT_COLOUR, STEP_COLOUR, GPU_COLOUR = "#d62728", "#1f5fa8", "#2ca02c"
KEEPS_UP_COLOUR = "#2a7d2a"
#: The size of the picture: inches at this many dots per inch.
FIGSIZE, DPI = (11.0, 6.4), 110


#: The waits repeat every ``period`` steps when their correlation with themselves that many steps later
#: reaches this (Pearson's r; random waits stay near 0, a few scattered stalls can reach 0.5) ...
PERIODIC_R = 0.5
#: ... and this share of the stalls (at least ``RECURRING_PAIRS`` of those with a step that far on) is
#: followed by another stall that many steps later.
RECURRING_SHARE, RECURRING_PAIRS = 0.6, 3
#: Among the spacings nearly as correlated as the best (its multiples are), the shortest is the period.
NEARLY_AS = 0.1


class StallPattern:
    """The steps whose wait stands out (``stalled``, indices into the timed steps) and, when the stalls
    recur at one spacing, that spacing in steps (``period``; None for stalls at no regular spacing)."""

    def __init__(self, stalled: list[int], period: int | None) -> None:
        self.stalled, self.period = stalled, period

    def text(self, wait_s: list[float], epoch_batches: int = 0) -> str | None:
        """The pattern in words, or None where no step stalled."""
        if not self.stalled:
            return None
        waits = [1e3 * wait_s[i] for i in self.stalled]
        lo, hi = f"{min(waits):.0f}", f"{max(waits):.0f}"
        what = f"{len(waits)} of {len(wait_s)} steps waited {lo if lo == hi else f'{lo}-{hi}'} ms"
        if not self.period:
            return f"stalls at no regular spacing ({what})"
        said = f"the waits repeat every {self.period} steps ({what})"
        if self.period == epoch_batches:
            return f"{said}: one epoch of {epoch_batches} batches, each pass over the loader starting anew"
        return f"{said}: a supply that runs dry and refills, as a worker pool does every few batches"


def stall_pattern(wait_s: list[float], step_s: list[float]) -> StallPattern:
    """Which steps stalled (a wait over three times the median wait and over half the median step, so
    that steady small waits are not stalls), and the spacing at which the waits repeat, if they do: of
    the spacings of 2 steps or more (seen at least twice over) at which the stalls recur
    (``RECURRING_SHARE``) and the waits correlate (``PERIODIC_R``), the shortest within ``NEARLY_AS``
    of the best correlated."""
    if not wait_s:
        return StallPattern([], None)
    floor = max(3 * statistics.median(wait_s), 0.5 * statistics.median(step_s or [0.0]), 1e-3)
    stalled = [i for i, w in enumerate(wait_s) if w > floor]
    r = {spacing: _recurring(wait_s, stalled, spacing) for spacing in range(2, len(wait_s) // 2 + 1)}
    r = {k: v for k, v in r.items() if v is not None}
    if not r:
        return StallPattern(stalled, None)
    best = max(r.values())
    return StallPattern(stalled, min(k for k, v in r.items() if v >= best - NEARLY_AS))


def _recurring(wait_s: list[float], stalled: list[int], spacing: int) -> float | None:
    """The waits' correlation with themselves ``spacing`` steps later, where the stalls recur at that
    spacing; None where they do not."""
    later = [i + spacing in stalled for i in stalled if i + spacing < len(wait_s)]
    if len(later) < RECURRING_PAIRS or sum(later) < RECURRING_SHARE * len(later):
        return None
    waits = np.asarray(wait_s, dtype=np.float64)
    a, b = waits[:-spacing], waits[spacing:]
    if a.std() == 0 or b.std() == 0:
        return None
    r = float(np.corrcoef(a, b)[0, 1])
    return r if r >= PERIODIC_R else None


def _verdict(report: DoctorReport) -> tuple[str, str]:
    """The verdict in words and its colour."""
    if report.stall < STALL_OK:
        return f"data keeps up: {report.stall:.0%} of the time waiting for data", KEEPS_UP_COLOUR
    return f"data bottleneck: training waits for data {report.stall:.0%} of the time", WAIT_COLOUR


def _title(report: DoctorReport) -> str:
    name = Path(report.cache.rstrip("/")).name or report.cache
    head = (
        f"cachekit doctor: {name}, batch {report.batch_size}, {report.steps} timed steps, "
        f"{report.samples_per_s:,.0f} samples/s"
    )
    return "\n".join(
        [head, textwrap.shorten(f"loader: {report.mode}", 160), textwrap.shorten(f"step: {report.step}", 160)]
    )


def _steps_panel(ax, report: DoctorReport, pattern: StallPattern) -> None:
    """Each step over its own time span: compute below, its wait stacked above; stalls marked."""
    starts, waits = report.start_s, [1e3 * w for w in report.wait_s]
    work = [1e3 * s for s in report.step_s]
    spans = [w + s for w, s in zip(report.wait_s, report.step_s)]
    edge = {"edgecolor": "white", "linewidth": 0.4, "align": "edge"}
    ax.bar(starts, work, width=spans, color=STEP_COLOUR, label=STEP_LABEL, **edge)
    ax.bar(starts, waits, width=spans, bottom=work, color=WAIT_COLOUR, label=WAIT_LABEL, **edge)
    top = max((w + s for w, s in zip(waits, work)), default=1.0) or 1.0
    if pattern.stalled:
        ax.plot(
            [starts[i] + spans[i] / 2 for i in pattern.stalled],
            [waits[i] + work[i] + 0.04 * top for i in pattern.stalled],
            "v", color="#222222", markersize=5, label="a stall", linestyle="none",
        )  # fmt: skip
    ax.set_ylim(0, top * 1.45)  # room above the bars for the verdict
    ax.set_ylabel("ms per step")
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    verdict, colour = _verdict(report)
    lines = [verdict]
    said = pattern.text(report.wait_s, report.epoch_batches)
    if said:
        lines += textwrap.wrap(said, 110)
    ax.text(
        0.01, 0.97, "\n".join(lines), transform=ax.transAxes, va="top", ha="left", fontsize=10,
        color=colour, bbox={"facecolor": "white", "edgecolor": colour, "boxstyle": "round,pad=0.4"},
    )  # fmt: skip


def _strip_panel(ax, report: DoctorReport) -> None:
    """The same steps as a strip of waiting and computing, with GPU utilisation (0-100 %) over it."""
    waiting = [(t, w) for t, w in zip(report.start_s, report.wait_s)]
    working = [(t + w, s) for t, w, s in zip(report.start_s, report.wait_s, report.step_s)]
    ax.broken_barh(waiting, (0, 100), facecolors=WAIT_COLOUR, alpha=0.35, linewidth=0)
    ax.broken_barh(working, (0, 100), facecolors=STEP_COLOUR, alpha=0.18, linewidth=0)
    ax.set_ylim(0, 100)
    ax.set_xlabel("seconds since the first timed step")
    ax.spines[["top", "right"]].set_visible(False)
    if report.gpu_trace:
        times, busy = zip(*report.gpu_trace)
        ax.plot(times, busy, color=GPU_COLOUR, linewidth=1.6, label="GPU utilisation (NVML)")
        ax.set_ylabel("GPU busy %")
    else:
        ax.set_yticks([])
        ax.set_ylabel("the loop")
        ax.text(
            0.5, 0.5, "GPU utilisation not measured: no CUDA device, or no NVML "
            f"(pip install '{DIST_NAME}[gpu]')", transform=ax.transAxes, ha="center", va="center",
            fontsize=9, color="#444444", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8},
        )  # fmt: skip


def doctor_figure(report: DoctorReport) -> Figure:
    """The picture of ``report``'s timed steps, as a matplotlib Figure (not drawn on any screen)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional: the [plot] extra
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    steps_ax, strip_ax = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    _steps_panel(steps_ax, report, stall_pattern(report.wait_s, report.step_s))
    _strip_panel(strip_ax, report)
    end = max((t + w + s for t, w, s in zip(report.start_s, report.wait_s, report.step_s)), default=1.0)
    strip_ax.set_xlim(0, end)
    handles = [h for ax in (steps_ax, strip_ax) for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False, fontsize=9)
    fig.suptitle(_title(report), fontsize=10.5)
    return fig


def plot_report(report: DoctorReport, path: str | os.PathLike) -> Path:
    """Write the picture of ``report`` as a PNG at ``path``; a failed write is one line."""
    out = Path(path)
    existed = out.exists()
    fig = doctor_figure(report)
    try:
        fig.savefig(out, format="png")
    except OSError as exc:
        if not existed and out.is_file():
            out.unlink()  # no half-written file left behind
        reason = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise CachekitError(f"cannot write {out}: {reason}") from None
    return out
