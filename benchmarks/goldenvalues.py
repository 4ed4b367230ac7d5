"""How the golden record of ``golden.py`` holds and compares outputs: the digest of each output of a
batch, a device case's images as values (in the ``.npz`` beside the record), the comparison (bit for
bit, or within a level) and the record's files.

A batch is recorded as the sha256 (its first 16 hex digits) of each of its outputs: images, labels,
and each target key over the batch's samples in order (boxes, classes, iscrowd, mask, ...), each with
its dtype and shape.

The device path's images come from float kernels (batched matrix products, ``grid_sample``) that
round a value a level apart on another CPU (its SIMD width, its BLAS's code path), so a ``.device``
case's images are also recorded as values and compared within a level, as the docs promise
(``within_a_level``: the fractions allowed are beside it); its labels and targets (moved on the host)
and every output of the other cases are compared by digest, bit for bit. The values are stored as
their bits minus those of the same transform's ``.threads`` case (run beside it and checked
bit-identical first), mostly zeros, in an ``.npz`` beside the record (``outputs.npz``, about 1.7 MB).

The file is ``{"versions": {torch, cv2, numpy}, "transforms": {name: the list as text}, "cases":
{name: [{key: digest} per batch]}, "values": {device case: its member of the .npz}}``; the digests
of a device case's images are the recording machine's (equal ones need no values). Bit-identity is
only defined for the same kernels: a record made with other torch, cv2 or numpy versions is
reported, not compared as equal.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch

__all__ = [
    "AMPLIFIED", "DEVICE_KEY", "DIGITS", "EPOCHS", "EPS", "OFF", "Run", "compare", "decode_values",
    "digest_batch", "dumps", "encode_values", "levels", "read_record", "twin", "values_path",
    "version_mismatch", "versions", "within_a_level", "write_record",
]  # fmt: skip

#: Each case reads this many epochs; ``compare`` names a batch by its epoch and its place in it.
EPOCHS = 3
#: Hex digits kept of each sha256.
DIGITS = 16
#: The device path computes images in float (batched matrix products, ``grid_sample``, colour in fp32)
#: and rounds them; another CPU (its SIMD width, its BLAS's code path) may round a value the other way
#: where the exact result lies within float error of a half level. So a ``.device`` case's images are
#: recorded as values and compared within a level, as the docs promise; its other outputs (labels;
#: boxes and masks, moved on the host) and every output of the other cases, bit for bit. Measured
#: under ``ATEN_CPU_CAPABILITY=avx2`` and ``=default`` and ``MKL_CBWR=COMPATIBLE`` against an
#: AVX512 machine's record: at most 0.13% of a batch's values a level off, none more except where a
#: later step amplifies (below).
DEVICE_KEY = "images"
#: At most this fraction of a batch's values may differ at all (a changed rounding rule moves half).
OFF = 0.02
#: After a step that may turn a level in into more out (``golden.AMPLIFIERS``: a contrast or colour
#: gain above 1, solarize's threshold, posterize's bits, equalize's histogram, an integer hue), at
#: most ``AMPLIFIED`` of a batch's values may be more than a level off (measured: 0.05%, by up to
#: 204 levels); in a case without one (``Run.amplifies``), none.
AMPLIFIED = 0.005
#: Images are compared in levels of 255 (a normalised batch back through the cache's mean and std);
#: float images within this of each other are equal.
EPS = 1e-3


def versions() -> dict[str, str]:
    """The versions whose kernels a record's bit-identity holds for."""
    return {"torch": torch.__version__, "cv2": cv2.__version__, "numpy": np.__version__}


# --- digests ----------------------------------------------------------------------------------------


def _leaves(value, path: str, index: tuple) -> Iterator[tuple[str, tuple, object]]:
    """(name, position, leaf) of a batch: a list's items share their name and differ in position."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key), index)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[]", (*index, i))
    else:
        yield path, index, value


def _batch_parts(batch) -> dict:
    """A loader's batch as named parts: the images, then labels (a tensor) or targets, then others."""
    if not isinstance(batch, (tuple, list)):
        return {"batch": batch}
    parts = {"images": batch[0]}
    if len(batch) > 1:
        parts["labels" if isinstance(batch[1], torch.Tensor) else "targets"] = batch[1]
    for i, extra in enumerate(batch[2:], start=2):
        parts[f"out{i}"] = extra
    return parts


def _header(t: torch.Tensor) -> str:
    """What a tensor's digest holds besides its bytes: dtype, shape, and channels-last where it is."""
    last = t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)
    return f"{t.dtype}|{tuple(t.shape)}|{'channels_last|' if last else ''}"


def digest_batch(batch) -> dict[str, str]:
    """``{key: sha256}`` of each output of one batch: a tensor's dtype, shape and bytes; a list's
    items in order, each with its position (so ``targets[].boxes`` is every sample's boxes)."""
    hashes: dict[str, hashlib._Hash] = {}
    for key, index, leaf in _leaves(_batch_parts(batch), "", ()):
        h = hashes.setdefault(key, hashlib.sha256())
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().to("cpu")
            h.update(f"{index}|{_header(t)}".encode())
            t = t.contiguous()
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # scalars too
        elif isinstance(leaf, np.ndarray):
            a = np.ascontiguousarray(leaf)
            h.update(f"{index}|{a.dtype}|{a.shape}|".encode())
            h.update(a.tobytes())
        else:
            h.update(f"{index}|{type(leaf).__name__}|{leaf!r}|".encode())
    return {key: h.hexdigest()[:DIGITS] for key, h in hashes.items()}


@dataclass
class Run:
    """One case's batches: each one's digests, and its images as values (C order, with the header of
    their digest), the cache's mean and std (what ``normalize=True`` divided by; else 0 and 1), and
    whether its list amplifies a level (``AMPLIFIED``)."""

    digests: list[dict[str, str]] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    stats: tuple = (0.0, 1.0)
    amplifies: bool = False

    def add(self, batch) -> None:
        """One batch of the loader: its digests, and its images (where they are a tensor) as values."""
        self.digests.append(digest_batch(batch))
        images = _batch_parts(batch).get(DEVICE_KEY)
        if isinstance(images, torch.Tensor):
            images = images.detach().to("cpu")
            self.headers.append(_header(images))
            self.images.append(images.contiguous().numpy())


# --- the device path: values within a level ---------------------------------------------------------


def twin(name: str) -> str | None:
    """The threads case of a device case (the base its values are recorded against), or None."""
    return name.removesuffix(".device") + ".threads" if name.endswith(".device") else None


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(f"u{a.dtype.itemsize}")


def encode_values(device: Run, threads: Run) -> np.ndarray:
    """A device case's images, as their bits minus its threads case's (unsigned, modulo: exact for
    any dtype, and mostly zeros, which compress to little)."""
    if device.headers != threads.headers:
        raise ValueError(f"device images {device.headers} unlike the threads case's {threads.headers}")
    return np.concatenate([_bits(d) - _bits(t) for d, t in zip(device.images, threads.images)])


def decode_values(diff: np.ndarray, threads: Run) -> list[np.ndarray] | None:
    """The recorded device images: the threads case's plus the recorded difference (None when it
    does not fit them)."""
    out, at = [], 0
    for t in threads.images:
        bits = _bits(t)
        if diff.dtype != bits.dtype or at + bits.size > diff.size:
            return None
        out.append((bits + diff[at : at + bits.size]).view(t.dtype).reshape(t.shape))
        at += bits.size
    return out if at == diff.size else None


def levels(images: np.ndarray, stats: tuple) -> np.ndarray:
    """Values in levels of 255: uint8 as they are; float ones through ``stats`` (mean, std) back."""
    if images.dtype == np.uint8:
        return images.astype(np.float64)
    mean, std = (np.asarray(s, np.float64).reshape(1, -1, 1, 1) for s in stats)
    return (images.astype(np.float64) * std + mean) * 255


def within_a_level(here: np.ndarray, recorded: np.ndarray, run: Run) -> str | None:
    """Why a device batch's images are not within a level of the record's, or None."""
    d = np.abs(levels(here, run.stats) - levels(recorded, run.stats))
    beyond, allowed = int((d > 1 + EPS).sum()), int(AMPLIFIED * d.size) if run.amplifies else 0
    if beyond > allowed:
        at = [int(i) for i in np.unravel_index(int(d.argmax()), d.shape)]
        largest = f"{d.max():.3g} levels at {at}"
        return f"images: {beyond} values more than a level off ({allowed} allowed; {largest})"
    off, most = int((d > EPS).sum()), int(OFF * d.size)
    return f"images: {off} values a level off ({most} allowed)" if off > most else None


def _recorded_images(name: str, expected: dict, actual: dict) -> list[np.ndarray] | str | None:
    """A device case's recorded images, rebuilt on its threads case run here (bit-identical to the
    record's, or a line says so); None where images are compared by digest (another case, or no run)."""
    runs, base = actual.get("runs", {}), twin(name)
    if base is None or name not in runs:
        return None
    diff = expected.get("values", {}).get(name)
    if diff is None:
        return "images differ (no values recorded)"
    if base not in runs:
        return f"images not compared: {base} not run"
    if [x.get(DEVICE_KEY) for x in expected["cases"].get(base, [])] != [
        y.get(DEVICE_KEY) for y in actual["cases"][base]
    ]:
        return f"images not compared: {base}'s differ from the record"
    if runs[name].headers != runs[base].headers:
        return f"images: dtype, shape or memory format unlike the record's ({base}'s)"
    images = decode_values(diff, runs[base])
    return images if images is not None else "images: recorded values of another size"


def _differences(name: str, expected: dict, actual: dict) -> list[str]:
    """Per batch, what differs from the record ("" where nothing does)."""
    a, b = expected["cases"][name], actual["cases"][name]
    recorded = None
    if any(x.get(DEVICE_KEY) != y.get(DEVICE_KEY) for x, y in zip(a, b)):
        recorded = _recorded_images(name, expected, actual)
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        what = [k for k in x if k in y and x[k] != y[k]]
        notes = []
        if DEVICE_KEY in what and recorded is not None:
            what.remove(DEVICE_KEY)
            note = recorded if isinstance(recorded, str) else within_a_level(
                actual["runs"][name].images[i], recorded[i], actual["runs"][name]
            )  # fmt: skip
            notes += [note] if note else []
        gone, new = sorted(set(x) - set(y)), sorted(set(y) - set(x))
        out.append(", ".join(
            ([f"{', '.join(what)} differ"] if what else []) + notes
            + ([f"{', '.join(gone)} missing"] if gone else []) + ([f"{', '.join(new)} new"] if new else [])
        ))  # fmt: skip
    return out


def compare(expected: dict, actual: dict, names: list[str] | None = None) -> list[str]:
    """One line per case that differs: the first batch and what changed there (keys, or a device
    case's images beyond a level: ``within_a_level``), a batch count, a case missing from either side.
    A device case's images are compared as values where ``actual["runs"]`` holds it and its threads
    case; by digest where not. ``names``: only these cases."""
    want, got = expected["cases"], actual["cases"]
    problems = []
    for name in names if names is not None else sorted(set(want) | set(got)):
        if name not in got:
            problems.append(f"{name}: recorded, not run")
            continue
        if name not in want:
            problems.append(f"{name}: run, not recorded")
            continue
        if len(want[name]) != len(got[name]):
            problems.append(f"{name}: {len(got[name])} batches, {len(want[name])} recorded")
            continue
        details = _differences(name, expected, actual)
        first = next((i for i, d in enumerate(details) if d), None)
        if first is None:
            continue
        epoch, batch = divmod(first, len(details) // EPOCHS)
        later = sum(bool(d) for d in details[first + 1 :])
        problems.append(f"{name}: batch {first} (epoch {epoch}, batch {batch}): {details[first]}"
                        + (f"; {later} later batches differ too" if later else ""))  # fmt: skip
    return problems


def version_mismatch(expected: dict) -> str | None:
    """Why a record cannot be compared bit for bit here (other kernels), or None."""
    now, then = versions(), expected.get("versions", {})
    diff = [f"{k} {then.get(k)} recorded, {now[k]} here" for k in now if then.get(k) != now[k]]
    return "; ".join(diff) or None


def _member(values: np.ndarray) -> str:
    return hashlib.sha256(f"{values.dtype}|".encode() + values.tobytes()).hexdigest()[:DIGITS]


def dumps(result: dict) -> str:
    """The record as JSON, one case a line (a change shows as the lines of its cases); ``values``
    names each device case's member of the ``.npz`` beside it (its content's digest)."""
    sections = {
        "transforms": result["transforms"],
        "cases": result["cases"],
        "values": {name: _member(v) for name, v in result["values"].items()},
    }
    lines = ["{", f' "versions": {json.dumps(result["versions"], sort_keys=True)},']
    for section, entries in sections.items():
        items = sorted(entries.items())
        lines.append(f' "{section}": {{')
        lines += [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if i < len(items) - 1 else "")
                  for i, (k, v) in enumerate(items)]  # fmt: skip
        lines.append(" }" if section == "values" else " },")
    return "\n".join([*lines, "}"]) + "\n"


def values_path(record: str | Path) -> Path:
    """Where a record's values lie: beside it, ``.npz`` for ``.json``."""
    return Path(record).with_suffix(".npz")


def write_record(path: str | Path, result: dict) -> None:
    """The record's JSON, and its values as an ``.npz``: one member per distinct array (the layouts
    of one recipe share theirs), deflated, dated 1980 so that the same values give the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    members = {_member(v): v for v in result["values"].values()}
    with zipfile.ZipFile(values_path(path), "w") as z:
        for name in sorted(members):
            data = io.BytesIO()
            np.lib.format.write_array(data, members[name], allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, data.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    path.write_text(dumps(result))


def read_record(path: str | Path) -> dict:
    """A record as ``run_all`` gives it (less runs): its JSON, each device case's values read from the
    ``.npz`` beside it."""
    record = json.loads(Path(path).read_text())
    if not isinstance(record, dict) or not {"cases", "versions"} <= set(record):
        raise ValueError("no cases and versions")
    names = record.get("values", {})
    if names:
        with np.load(values_path(path), allow_pickle=False) as z:
            members = {m: z[m] for m in set(names.values())}
        record["values"] = {name: members[m] for name, m in names.items()}
    return record
