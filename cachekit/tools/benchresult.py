"""A bench run's result: the rows compared with the best raw loader and with the copy limit, the
warnings a figure should not be trusted without, and the record of the run (JSON-able): its
settings, the machine, the raw inputs and the caches."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..constants import VERSION
from ..cpus import available_cpus
from .baselines import RawInputs
from .benchrows import augment_record
from .benchview import workers_text

__all__ = [
    "SPREAD_WARNING",
    "RunFigures",
    "compare_rows",
    "ratios",
    "copy_limit_warnings",
    "raw_unit",
    "result_record",
]

#: A row whose warm epochs' (max - min) / median passes this is named in a warning.
SPREAD_WARNING = 0.25


@dataclass(frozen=True, kw_only=True)
class RunFigures:
    """What a run measured, before it is recorded with its settings, machine, inputs and caches."""

    samples: int  #: samples per epoch in every row
    aligned_by: str  #: how the rows' samples were matched
    crop: tuple[int, int] | None  #: the size every row's samples are augmented to (None: not augmented)
    steps: list | None  #: ``--augment SPEC``'s transforms, which the make_loader rows alone run
    memcpy: float  #: bytes per second one core copies
    rows: list[dict]
    baseline: dict | None  #: the best raw row
    ratios: dict
    warnings: list[str]


def compare_rows(rows: list[dict], warnings: list[str], log: Callable[[str], None]) -> dict | None:
    """Each row's speed-up over the best raw row (None without raw rows), which is returned; a row
    whose warm epochs spread too far is named in ``warnings`` (and logged)."""
    raw_rows = [r for r in rows if r["loader"].startswith("raw-")]
    baseline = max(raw_rows, key=lambda r: r["samples_per_s"]) if raw_rows else None
    for r in rows:
        for key, speed in (("speedup", "samples_per_s"), ("speedup_min", "samples_per_s_min"),
                           ("speedup_max", "samples_per_s_max")):  # fmt: skip
            r[key] = r[speed] / baseline["samples_per_s"] if baseline else None
        if r["spread"] > SPREAD_WARNING:
            warnings.append(_spread_warning(r))
            log(f"warning: {warnings[-1]}")
    return baseline


def _spread_warning(row: dict) -> str:
    """One line naming a row whose warm epochs disagree too much for its median to be trusted."""
    return (
        f"{row['loader']}, {workers_text(row)}: its {row['repeats']} warm epochs ran "
        f"{row['samples_per_s_min']:,.0f}-{row['samples_per_s_max']:,.0f} samples/s, a spread of "
        f"{row['spread']:.0%} of the median (over {SPREAD_WARNING:.0%}): the machine was busy or an "
        "epoch is too short; rerun with more --repeats or --samples before trusting its ratio"
    )


def ratios(rows: list[dict], baseline: dict | None, memcpy: float | None) -> dict:
    """The headline figures: cache via make_loader's defaults vs the baseline, and vs memcpy
    (None for augmented rows, whose speed a resize bounds, not a copy)."""
    out = {}
    for r in rows:
        if r["workers"] == "make_loader":
            key = r["loader"]
            if baseline:
                out[f"{key} make_loader / {baseline['loader']} best"] = (
                    r["samples_per_s"] / baseline["samples_per_s"]
                )
            if memcpy:
                out[f"{key} make_loader / memcpy"] = r["MB_per_s"] * 1e6 / memcpy
    return out


def copy_limit_warnings(ratios: dict, warnings: list[str], log: Callable[[str], None]) -> None:
    """Name in ``warnings`` (and log) every ratio over the copy limit: no loader can pass it."""
    for key, value in ratios.items():
        if key.endswith("/ memcpy") and value > 1.0:
            warnings.append(
                f"{key} is {value:.2f}: over the copy limit, which no loader can pass; this figure "
                "cannot be trusted (too few batches timed, or the clock caught a pause)"
            )
            log(f"warning: {warnings[-1]}")


def raw_unit(inputs: RawInputs) -> str:
    """What the raw inputs are: files of their own, or records of Parquet files, tars or a dataset."""
    return "records" if inputs.reads is not None and inputs.reads.reader is not None else "image files"


def _raw_summary(raw, inputs: RawInputs | None) -> dict | None:
    if inputs is None:
        return None
    return {
        "path": str(raw),
        "unit": raw_unit(inputs),
        "bytes": inputs.bytes,
        "found": inputs.found,
        "usable": len(inputs),
        "pipeline": inputs.pipeline.name,
        "skipped": [{"path": p, "reason": r} for p, r in inputs.skipped],
        "left_out_for_pil": [{"path": p, "reason": r} for p, r in inputs.refused],
    }


def _cache_summary(name: str, path, dataset) -> dict:
    return {
        "name": name,
        "path": str(path),
        "format": dataset.manifest.format,
        "bytes": dataset.manifest.total_bytes,
        "samples": len(dataset),
        "shape": list(dataset.sample_shape),
        "pipeline": dataset.manifest.pipeline.get("name"),
    }


def result_record(figures: RunFigures, config, raw, inputs: RawInputs | None, caches, datasets, names) -> dict:
    """A run's JSON-able record: its ``figures`` with the settings (``config``), the machine, the raw
    inputs and the caches (their ``names`` in the table)."""
    f = figures
    return {
        "cachekit_version": VERSION,
        "config": asdict(config),
        "samples": f.samples,
        "repeats": max(1, config.passes() - 1),  # warm epochs behind each row's median, min and max
        "aligned_by": f.aligned_by,
        "augment": augment_record(f.crop, f.steps) if f.crop else None,
        "machine": {
            "cpus_usable": available_cpus(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "memcpy_MB_per_s": f.memcpy / 1e6,
        },
        "raw": _raw_summary(raw, inputs),
        "caches": [_cache_summary(name, p, d) for name, p, d in zip(names, caches, datasets)],
        "rows": f.rows,
        "baseline": {k: f.baseline[k] for k in ("loader", "workers", "samples_per_s")} if f.baseline else None,
        "ratios": f.ratios,
        "warnings": f.warnings,
    }
