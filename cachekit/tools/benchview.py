"""Showing a ``cachekit bench`` result: the text table, the chart, and the words rows are named with.

The chart answers "how much faster is the cache?" at a glance: one bar per row, the speed-up over the
best raw loader on a linear axis (a log axis makes 150x look like 2x), labelled with that factor and
the samples/s behind it, coloured by kind with a legend; an augmented run says so in its title,
legend and table. matplotlib is optional
(``require_matplotlib`` says how to get it, and the CLI asks before any work starts).
"""

from __future__ import annotations

import errno
import json
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..constants import DIST_NAME
from ..errors import CachekitError, UsageError
from .report import human_bytes

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = [
    "check_outputs",
    "write_outputs",
    "cache_names",
    "format_table",
    "require_matplotlib",
    "bench_figure",
    "plot_result",
    "workers_text",
    "loader_text",
    "augment_text",
    "shape_text",
]

#: Bar colours by kind of row, and the legend's words for them.
KINDS = {
    "raw": ("#d9603b", "raw files, decoded every epoch"),
    "cache": ("#9cc3e6", "cache, plain DataLoader"),
    "make_loader": ("#1f5fa8", "cache, make_loader defaults"),
}
#: The legend's words when every row augments (``--augment``): who does the crop, and how.
AUGMENTED_KINDS = {
    "raw": "raw files, decoded every epoch",
    "cache": "cache, plain DataLoader + transform=",
    "make_loader": "cache, make_loader(augment=...)",
}


def augment_text(result: dict | Sequence[int]) -> str | None:
    """``RandomResizedCrop(224) + horizontal flip`` for an augmented result or a crop size
    (``HxW`` when not square); None for a plain result."""
    if isinstance(result, dict):
        if not result.get("augment"):
            return None
        if result["augment"].get("spec"):
            return result["augment"]["spec"]
        result = result["augment"]["size"]
    h, w = result
    return f"RandomResizedCrop({h if h == w else f'{h}x{w}'}) + horizontal flip"


def shape_text(shape: Sequence) -> str:
    """A stored sample's size: ``224x224``, or ``variable size`` for a cache of ragged samples."""
    return "variable size" if shape[1] is None else f"{shape[1]}x{shape[2]}"


def format_table(result: dict) -> str:
    """The figures as a plain-text table, one row per loader and worker setting."""
    head = ["loader", "workers", "epoch 1/s", "warm/s (min-max)", "MB/s", "1st batch", "speed-up"]
    lines = []
    for r in result["rows"]:
        speed = _factor(r["speedup"]) if r.get("speedup") else "-"
        lo, hi = _range(r)
        lines.append(
            [
                r["loader"],
                workers_text(r),
                f"{r['epoch1_samples_per_s']:,.0f}",
                f"{r['samples_per_s']:,.0f} ({lo:,.0f}-{hi:,.0f})",
                f"{r['MB_per_s']:,.0f}",
                f"{r['first_batch_s']:.3f} s",
                speed,
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = []
    aug = result.get("augment")
    if aug and aug.get("spec"):
        out.append(f"augmented rows: make_loader(augment=[{aug['spec']}]), batched (no per-sample rows)")
    elif aug:
        out.append(f"augmented rows: every row does {augment_text(result)} per sample")
    out += [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*row) for row in lines]
    m = result["machine"]
    out.append("")
    out.append(
        f"{result['samples']} samples per epoch in every row (matched by {result['aligned_by']}), "
        f"batch {result['config']['batch_size']}, {m['cpus_usable']} usable CPUs, "
        f"memcpy {m['memcpy_MB_per_s']:,.0f} MB/s"
    )
    repeats = result.get("repeats")
    if repeats:
        out.append(f"warm/s: the median of {repeats} warm epoch{'s' if repeats > 1 else ''} (their min-max)")
    if result.get("baseline"):
        b = result["baseline"]
        out.append(
            f"speed-up: median warm samples/s over the best raw loader ({b['loader']}, {workers_text(b)}, "
            f"{b['samples_per_s']:,.0f} samples/s)"
        )
    raw = result.get("raw")
    if raw:
        out.append(
            f"raw:   {raw['found']} {raw.get('unit', 'image files')}: a build keeps {raw['usable']} "
            f"({human_bytes(raw['bytes'])}) and skips {len(raw['skipped'])}"
            + (
                f"; {len(raw['left_out_for_pil'])} left out of every row (PIL cannot read them)"
                if raw["left_out_for_pil"]
                else ""
            )
        )
    for c in result["caches"]:
        what = [c["format"], *([c["pipeline"]] if c.get("pipeline") else []), shape_text(c["shape"])]
        out.append(
            f"cache: {human_bytes(c['bytes'])} ({', '.join(what)}, {c['samples']} samples) {c['path']}"
        )
    if aug and aug.get("spec"):
        out.append(f"augment: {aug['spec']} (output {aug['size'][0]}x{aug['size'][1]})")
    elif aug:
        h, w = aug["size"]
        out.append(
            f"augment: crops of {h}x{w}, scale {tuple(aug['scale'])}, ratio ({aug['ratio'][0]:.3g}, "
            f"{aug['ratio'][1]:.3g}), flip p {aug['flip_p']}"
        )
    if aug:
        for kind, how in aug["how"].items():
            out.append(f"  {kind}: {how}")
    for key, value in result["ratios"].items():
        untrusted = key.endswith("/ memcpy") and value > 1.0
        out.append(f"{key}: {value:.2f}" + (" (over the copy limit: cannot be trusted)" if untrusted else ""))
    for warning in result.get("warnings", []):
        out.append(f"warning: {warning}")
    return "\n".join(out)


def check_outputs(json_path: str | None, plot_path: str | None) -> None:
    """Refuse, before a long run, outputs that could not be written after it (UsageError)."""
    if plot_path:
        require_matplotlib()
    for flag, target in (("--json", json_path), ("--plot", plot_path)):
        if not target:
            continue
        folder = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(folder):
            raise UsageError(f"{flag} {target}: its folder does not exist")
        if os.path.isdir(target):
            raise UsageError(f"{flag} {target}: is a folder; give a file name")
        if not os.access(folder, os.W_OK) or (os.path.exists(target) and not os.access(target, os.W_OK)):
            raise UsageError(f"{flag} {target}: not writable")


def write_outputs(result: dict, json_path: str | None, plot_path: str | None) -> list[str]:
    """Write the JSON figures and the chart; return what was written. A failed write is one line."""
    written = []
    for target, write in ((json_path, _write_json), (plot_path, plot_result)):
        if not target:
            continue
        existed = os.path.exists(target)
        try:
            write(result, target)
        except OSError as exc:
            if not existed and os.path.isfile(target):
                os.remove(target)  # no half-written file left behind
            reason = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
            raise CachekitError(f"cannot write {target}: {reason}") from None
        written.append(target)
    return written


def _write_json(result: dict, path: str | os.PathLike) -> None:
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)


def require_matplotlib() -> None:
    """Raise a one-line UsageError with the install command when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"--plot needs matplotlib: pip install '{DIST_NAME}[plot]'") from None


def cache_names(caches: Sequence[str | os.PathLike], formats: Sequence[str]) -> list[str]:
    """``cache-<format>``, plus the shortest end of the path that tells apart caches of one format."""
    base = [f"cache-{f}" for f in formats]
    parts = [str(p).rstrip("/").split("/") for p in caches]
    names = []
    for i, b in enumerate(base):
        rivals = [parts[j] for j in range(len(base)) if j != i and base[j] == b]
        if not rivals:
            names.append(b)
            continue
        k = 1
        while k < len(parts[i]) and any(r[-k:] == parts[i][-k:] for r in rivals):
            k += 1
        names.append(f"{b} ({'/'.join(parts[i][-k:])})")
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


def workers_text(row: dict) -> str:
    """How a row loads: "in-process", "2 workers", or make_loader's choice in words."""
    workers = row["workers"]
    if workers == "make_loader":
        mode = (
            str(row.get("mode", ""))
            .replace(" batched reads", "")
            .replace(" prefetch thread", " prefetch")
            .replace(" threads over each batch", " threads")
            .replace("worker processes", "workers")
            .replace("; augment on CPU threads", "")  # the title says every row augments
            .replace("; augment on ", ", augment on ")
        )
        return f"make_loader ({mode})" if mode else "make_loader"
    if workers == 0:
        return "in-process"
    return f"{workers} worker" + ("s" if workers != 1 else "")


def loader_text(name: str) -> str:
    """A row's loader in words: ``raw-pil`` -> "raw files, PIL", ``cache-pt (a)`` -> "pt cache (a)"."""
    if name.startswith("raw-"):
        backend = name[len("raw-") :]
        return "raw files, " + {"pil": "PIL", "opencv": "OpenCV"}.get(backend, backend)
    if name.startswith("cache-"):
        fmt, _, rest = name[len("cache-") :].partition(" ")
        return f"{fmt} cache" + (f" {rest}" if rest else "")
    return name


def _kind(row: dict) -> str:
    if row["loader"].startswith("raw-"):
        return "raw"
    return "make_loader" if row["workers"] == "make_loader" else "cache"


def _range(row: dict) -> tuple[float, float]:
    """A row's slowest and fastest warm epoch (samples/s); its one figure for an older result."""
    median = row["samples_per_s"]
    return row.get("samples_per_s_min", median), row.get("samples_per_s_max", median)


def _factor(x: float) -> str:
    return f"{x:,.0f}x" if x >= 10 else f"{x:.1f}x" if x >= 1 else f"{x:.2f}x"


def bench_figure(result: dict) -> Figure:
    """The chart of a ``run_bench`` result, as a matplotlib Figure (not drawn on any screen)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = result["rows"]
    baseline = result.get("baseline")
    relative = baseline is not None and all(r.get("speedup") for r in rows)
    values = [r["speedup"] if relative else r["samples_per_s"] for r in rows]
    # each bar's warm epochs, slowest to fastest, as an error bar round its median
    scale = [v / r["samples_per_s"] for v, r in zip(values, rows)]
    lows = [max(0.0, v - _range(r)[0] * k) for v, r, k in zip(values, rows, scale)]
    highs = [max(0.0, _range(r)[1] * k - v) for v, r, k in zip(values, rows, scale)]  # no rounding below 0
    labels = [f"{loader_text(r['loader'])}, {workers_text(r)}" for r in rows]
    kinds = [_kind(r) for r in rows]
    bar_text = [
        f"{_factor(v)}  ({r['samples_per_s']:,.0f} samples/s)" if relative else f"{v:,.0f} samples/s"
        for v, r in zip(values, rows)
    ]

    labels = [textwrap.fill(label, 60) for label in labels]
    longest = max(len(line) for label in labels for line in label.splitlines())
    width = min(16.0, max(10.0, 6.0 + 0.08 * longest))
    # one row per bar, half a row more between loaders, the first row at the top
    steps = [0.0] + [1.5 if a["loader"] != b["loader"] else 1.0 for a, b in zip(rows, rows[1:])]
    depth = [sum(steps[: i + 1]) for i in range(len(rows))]
    y = [depth[-1] - d for d in depth]
    fig = Figure(figsize=(width, 1.9 + 0.42 * (depth[-1] + 1)), layout="constrained", dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    bars = ax.barh(
        y,
        values,
        color=[KINDS[k][0] for k in kinds],
        height=0.7,
        xerr=[lows, highs],
        error_kw={"ecolor": "#333333", "elinewidth": 1, "capsize": 3},
    )
    ax.set_yticks(y, labels)
    ax.bar_label(bars, bar_text, padding=4, fontsize=9)
    ax.set_ylim(-0.6, depth[-1] + 0.6)
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    if relative:
        ax.set_xlabel("speed-up over the best raw loader (x, linear scale)")
    else:
        ax.set_xlabel("samples/s (linear scale)")
    present = [k for k in KINDS if k in kinds]
    words = {k: AUGMENTED_KINDS[k] if result.get("augment") else KINDS[k][1] for k in present}
    handles = [Patch(color=KINDS[k][0], label=words[k]) for k in present]
    legend = fig.legend(
        handles=handles, loc="outside lower center", ncols=len(present), frameon=False, fontsize=9
    )
    fig.canvas.draw()
    if legend.get_window_extent(fig.canvas.get_renderer()).width > fig.bbox.width:  # one entry a line
        legend.remove()
        fig.legend(handles=handles, loc="outside lower center", ncols=1, frameon=False, fontsize=9)
    cfg, machine = result["config"], result["machine"]
    shape = result["caches"][0]["shape"] if result.get("caches") else None
    augmented = augment_text(result)
    if augmented:
        recipes = sorted({c.get("pipeline") or c["format"] for c in result.get("caches", [])})
        source = f" from {'/'.join(recipes)} caches" if recipes else ""
        title = f"cachekit bench, augmented: every row does {augmented} per sample"
        title += f"\n{result['samples']:,} samples{source}, batch {cfg['batch_size']}, "
    else:
        what = f"{result['samples']:,} samples" + (f" of {shape_text(shape)}" if shape else "")
        title = f"cachekit bench: {what}, batch {cfg['batch_size']}, "
    repeats = result.get("repeats")
    title += f"median of {repeats} warm epochs (bars: min-max)" if repeats else "warm epochs"
    title += f", {machine['cpus_usable']} usable CPUs"
    if relative:
        who = f"{loader_text(baseline['loader'])}, {workers_text(baseline)}"
        title += f"\n1x = the best raw loader: {who}, {baseline['samples_per_s']:,.0f} samples/s"
    fig.suptitle(title, fontsize=11)
    _fit_labels(fig, ax, [v + h for v, h in zip(values, highs)], ax.texts)
    return fig


def _fit_labels(fig: Figure, ax, ends, texts) -> None:
    """Set the x range so every bar's label, after its bar's end (``ends``: its error bar's, in data
    units), ends inside the axes, with little to spare.

    Repeated a few times: the layout moves the axes when tick labels change.
    """
    widest = max(ends) or 1.0
    ax.set_xlim(0, widest * 1.05)
    for _ in range(4):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = ax.get_window_extent(renderer)
        need = widest * 1.02
        for end, text in zip(ends, texts):
            room = box.width - text.get_window_extent(renderer).width - 10  # the label's padding, a margin
            need = max(need, end * box.width / max(room, 1.0))
        if abs(need - ax.get_xlim()[1]) <= 0.005 * need:
            return
        ax.set_xlim(0, need)


def plot_result(result: dict, path: str | os.PathLike) -> Path:
    """Write the chart of a ``run_bench`` result as a PNG at ``path``."""
    fig = bench_figure(result)
    out = Path(path)
    fig.savefig(out)
    return out
