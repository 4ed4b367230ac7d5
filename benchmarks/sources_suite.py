"""sources: a build from Parquet, from WebDataset tars and from a Python dataset of encoded JPEGs,
against the same images built from a folder, per core.

sources  ``--images`` synthetic JPEGs (375x500, the default recipe) written as a folder, as Hugging
         Face Parquet files (``{bytes, path}`` images, a label), as tars (``.jpg`` + ``.cls``) and
         served by a map-style dataset of their bytes; each built with one worker process
         (``--repeats`` times in turn, the best), so a rate is per core; the ratio is each source's rate
         over the folder's (decoding dominates: the source must not)
"""

from __future__ import annotations

import io
import shutil
import sys
import tarfile
import time
from pathlib import Path

from registry import suite
from registry import synthetic_raw as _raw

from cachekit import BuildConfig, build


class JpegDataset:
    """A map-style dataset of encoded JPEGs and their classes (read from files on each access)."""

    def __init__(self, files: list[Path], labels: list[int], classes: list[str]) -> None:
        self.files, self.labels, self.classes = [str(f) for f in files], labels, classes

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return Path(self.files[i]).read_bytes(), self.labels[i]


def _sources(raw: Path, root: Path) -> dict[str, object]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = sorted(p.name for p in raw.iterdir() if p.is_dir())
    files = sorted(raw.rglob("*.jpg"))
    labels = [classes.index(f.parent.name) for f in files]
    folder = root / f"sources-{raw.name}"
    if not folder.is_dir():
        (folder / "pq").mkdir(parents=True)
        (folder / "tars").mkdir()
        per = max(1, len(files) // 4)
        for k in range(0, len(files), per):
            part = list(zip(files[k : k + per], labels[k : k + per]))
            rows = [{"image": {"bytes": f.read_bytes(), "path": f.name}, "label": y} for f, y in part]
            pq.write_table(pa.Table.from_pylist(rows), folder / "pq" / f"train-{k // per:05d}.parquet",
                           row_group_size=100)  # fmt: skip
            with tarfile.open(folder / "tars" / f"train-{k // per:06d}.tar", "w") as tar:
                for f, y in part:
                    for name, data in ((f"{f.stem}.jpg", f.read_bytes()), (f"{f.stem}.cls", str(y).encode())):
                        member = tarfile.TarInfo(name)
                        member.size = len(data)
                        tar.addfile(member, io.BytesIO(data))
    return {
        "folder": raw,
        "parquet": str(folder / "pq" / "train-*.parquet"),
        "tars": str(folder / "tars" / "train-*.tar"),
        "dataset": JpegDataset(files, labels, classes),
    }


@suite
def sources(args, root):
    raw = _raw(args, root)
    found = _sources(raw, root)
    times: dict[str, list[float]] = {name: [] for name in found}
    samples = {}
    for rep in range(args.repeats):  # the sources in turn, so that a busy moment hits them alike
        for name, source in found.items():
            out = root / f"sources-{name}-{rep}"
            t0 = time.perf_counter()
            result = build(source, out, BuildConfig(workers=1, progress=False, order="sorted"))
            times[name].append(time.perf_counter() - t0)
            samples[name] = result.manifest.num_samples
            shutil.rmtree(out)
    rows = {
        name: {"images": samples[name], "seconds": min(t), "images_per_s_per_core": samples[name] / min(t)}
        for name, t in times.items()
    }
    base = rows["folder"]["images_per_s_per_core"]
    for name, r in rows.items():
        r["ratio"] = r["images_per_s_per_core"] / base
        print(f"build from {name}: {r['images_per_s_per_core']:.0f} images/s per core, {r['ratio']:.2f}x the folder's",
              file=sys.stdout)  # fmt: skip
    return {"rows": rows}
