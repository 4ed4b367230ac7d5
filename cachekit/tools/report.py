"""Human-readable summaries: a cache (``cachekit info``), the environment (``cachekit env``) and the
built-in recipes with the operations a recipe may use (``cachekit recipes``)."""

from __future__ import annotations

import inspect
import platform
import sys
from importlib import metadata

from ..constants import VERSION
from ..cpus import available_cpus
from ..image.recipes import OPS, builtin_pipelines, load_pipeline
from ..store.manifest import Manifest

__all__ = ["describe", "environment", "human_bytes", "describe_recipes", "op_signature"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def describe(m: Manifest) -> str:
    """A few lines a person reads to know what a cache holds."""
    c, h, w = m.sample.shape
    raw_steps = m.pipeline.get("steps")
    steps = ", ".join(
        f"{s.get('op')}(" + ", ".join(f"{k}={v}" for k, v in s.items() if k != "op") + ")"
        for s in (raw_steps if isinstance(raw_steps, list) else [])
        if isinstance(s, dict)
    )
    classes = ", ".join(m.classes[:8]) + (f", ... ({len(m.classes)} in all)" if len(m.classes) > 8 else "")
    # what a read gives; a pixels-hwc cache keeps the same pixels channels-last on disk
    layout = (
        "read channels first, stored channels last"
        if m.format_options.get("store") == "pixels-hwc"
        else "channels first"
    )
    lines = [
        f"samples:   {m.num_samples} ({len(m.skipped)} inputs skipped)",
        (
            f"sample:    uint8 [{c}, H, W] RGB, {layout}, each at its own size"
            if m.sample.ragged
            else f"sample:    uint8 [{c}, {h}, {w}] RGB, {layout} ({human_bytes(m.sample.nbytes)} each)"
        ),
        f"format:    {m.format} ({', '.join(f'{k}={v}' for k, v in sorted(m.format_options.items()))})",
        f"shards:    {len(m.shards)}, {human_bytes(m.total_bytes)} in all; "
        + (
            f"inputs mixed over them (seed {m.order.get('seed')})"
            if m.shards_mixed
            else "inputs in path order (--order sorted)"
        ),
        f"pipeline:  {m.pipeline.get('name')}: {steps or 'no steps'}",
        f"classes:   {classes or '(unlabelled)'}",
        f"fields:    {_fields(m)}",
        "mean/std:  "
        + " ".join(f"{v:.4f}" for v in m.mean)
        + " / "
        + " ".join(f"{v:.4f}" for v in m.std)
        + "  (of pixels / 255)",
        f"source:    {m.source.get('root', '?')} ({m.source.get('layout', '?')}, {m.source.get('inputs', '?')} inputs)",
        f"built:     {m.created} by cachekit {m.cachekit_version}; fingerprint {m.fingerprint[:16]}",
    ]
    dropped = m.source.get("dropped") or []
    if dropped:
        lines.append(f"annotations left out: {m.source.get('dropped_count', len(dropped))}")
        lines += [f"  {d.get('where')}: {d.get('reason')}" for d in dropped[:10] if isinstance(d, dict)]
        if m.source.get("dropped_count", len(dropped)) > 10:
            lines.append(
                f"  ... and {m.source.get('dropped_count', len(dropped)) - 10} more (manifest.json lists {len(dropped)})"
            )
    if m.skipped:
        lines.append("skipped:")
        lines += [f"  {s.path}: {s.reason}" for s in m.skipped[:10]]
        if len(m.skipped) > 10:
            lines.append(f"  ... and {len(m.skipped) - 10} more")
    return "\n".join(lines)


_FIELD_WORDS = {
    "label": "one class (int)",
    "labels": "several classes (int64 [K])",
    "boxes": "boxes (float32 [N, 4] xyxy, classes, iscrowd)",
    "mask": "class map (uint8 [H, W])",
    "text": "text (str)",
}


def _fields(m: Manifest) -> str:
    """What a sample's target holds, in words."""
    if not m.sample.fields:
        return "the class of each image (target: int)"
    parts = []
    for name, spec in m.sample.fields.items():
        if spec.kind == "array":
            shape = ", ".join("*" if v is None else str(v) for v in spec.params["shape"])
            parts.append(f"{name}: array ({spec.params['dtype']} [{shape}])")
        elif spec.kind == "keypoints":
            k, flip = spec.params["k"], spec.params.get("flip_idx")
            mirror = f", flip_idx {list(flip)}" if flip else ", no flip_idx (a flip keeps each point's index)"
            parts.append(f"{name}: {k} keypoints per box (float32 [N, {k}, 3] x, y, visibility){mirror}")
        else:
            parts.append(f"{name}: {_FIELD_WORDS[spec.kind]}")
    return "; ".join(parts) + " (target: dict)"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> str:
    """Versions, CPUs and GPUs: what a bug report needs to reproduce a problem."""
    import os

    import torch

    rows = [
        ("cachekit", VERSION),
        ("python", f"{sys.version.split()[0]} ({platform.platform()})"),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"),
    ]
    for dist in (
        "numpy",
        "opencv-python-headless",
        "h5py",
        "zarr",
        "dask",
        "distributed",
        "pillow",
        "pyarrow",
    ):
        rows.append((dist, _version(dist)))
    rows.append(("cpus", f"{available_cpus()} usable of {os.cpu_count()} (affinity and cgroup quota)"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append((f"gpu {i}", f"{p.name}, {human_bytes(p.total_memory)}"))
    else:
        rows.append(("gpus", "none (torch.cuda.is_available() is False)"))
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k + ':':<{width}}{v}" for k, v in rows)


def op_signature(name: str) -> str:
    """``op(param, param=default)``: the parameters a recipe step of op ``name`` takes."""
    params = inspect.signature(OPS[name].fn).parameters
    shown = []
    for p in params.values():
        if p.name not in OPS[name].params:
            continue
        shown.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return f"{name}({', '.join(shown)})"


def describe_recipes() -> str:
    """The built-in recipes (name, output, one line each) and every op a recipe may use."""
    from ..build.target import probe_shape

    rows = []
    for name in builtin_pipelines():
        pipeline = load_pipeline(name)
        _, h, w = probe_shape(pipeline)
        output = "own size" if h is None else f"{h}x{w}"
        rows.append((name, output, pipeline.description or "(no description)"))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = ["Built-in recipes (cachekit build RAW --out CACHE --pipeline NAME [--size N]):"]
    lines += [f"  {n:<{width[0]}}  {o:<{width[1]}}  {d}" for n, o, d in rows]
    lines += ["", 'Operations a recipe\'s [[steps]] may use (sizes: a number, "size" or "size*A/B"):']
    ops = [(op_signature(op), (inspect.getdoc(OPS[op].fn) or "").splitlines()[0]) for op in OPS]
    op_width = max(len(sig) for sig, _ in ops)
    lines += [f"  {sig:<{op_width}}  {doc.replace('``', '')}" for sig, doc in ops]
    lines += [
        "",
        "cachekit recipes NAME prints a recipe's TOML: copy it to start your own (--pipeline FILE.toml).",
    ]
    return "\n".join(lines)
