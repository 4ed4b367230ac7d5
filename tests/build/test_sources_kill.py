"""Builds from a Python dataset, an iterable, Parquet files and tars killed mid-way (SIGKILL, SIGTERM) resume to
a cache byte-identical to a clean build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from sourcekit import add_member

from cachekit import read_manifest
from cachekit.constants import PARTIAL_DIR
from cachekit.tools.verify import verify

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
ARGS = ["--shard-size", "2", "--workers", "2", "--size", "64", "--order", "sorted", "--quiet"]
_SCRIPT = """
import sys
sys.path.insert(0, {here!r})
from sourcekit import FileDataset
from cachekit import BuildConfig, build
files = sorted(str(p) for p in __import__("pathlib").Path({raw!r}).rglob("*.jpg"))
print(build(FileDataset(files, ["a", "b", "c"]), sys.argv[1],
            BuildConfig(shard_size=2, workers=2, size=64, progress=False)).summary())
"""
_STREAM_SCRIPT = """
import sys
sys.path.insert(0, {here!r})
from sourcekit import FileDataset
from cachekit import BuildConfig, build
files = sorted(str(p) for p in __import__("pathlib").Path({raw!r}).rglob("*.jpg"))
ds = FileDataset(files, ["a", "b", "c"])
stream = (ds[i] for i in range(len(ds)))  # no __len__: read once in order, resumed by position
print(build(stream, sys.argv[1], BuildConfig(shard_size=2, workers=2, size=64, progress=False),
            classes=["a", "b", "c"], source_id="big-jpegs").summary())
"""


@pytest.fixture(scope="module")
def sources(big_tree, tmp_path_factory) -> dict[str, str]:
    """The big JPEGs as a Python dataset (a script that builds it), Parquet files and tars."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    top = tmp_path_factory.mktemp("kill")
    files = sorted(big_tree.rglob("*.jpg"))[:48]
    rows = [{"image": {"bytes": p.read_bytes(), "path": p.name}, "label": i % 3} for i, p in enumerate(files)]
    (top / "pq").mkdir()
    for k in range(2):
        pq.write_table(pa.Table.from_pylist(rows[k * 24 : (k + 1) * 24]), top / "pq" / f"train-{k}.parquet",
                       row_group_size=5)  # fmt: skip
    (top / "tars").mkdir()
    for k in range(2):
        with tarfile.open(top / "tars" / f"train-{k:06d}.tar", "w") as tar:
            for i, p in enumerate(files[k * 24 : (k + 1) * 24]):
                add_member(tar, f"{p.stem}-{i}.jpg", p.read_bytes())
                add_member(tar, f"{p.stem}-{i}.json", json.dumps({"label": i % 3}).encode())
    (top / "build_dataset.py").write_text(_SCRIPT.format(here=str(HERE), raw=str(big_tree)))
    (top / "build_stream.py").write_text(_STREAM_SCRIPT.format(here=str(HERE), raw=str(big_tree)))
    return {
        "dataset": str(top / "build_dataset.py"),
        "stream": str(top / "build_stream.py"),
        "parquet": str(top / "pq" / "train-*.parquet"),
        "tar": str(top / "tars" / "train-{000000..000001}.tar"),
    }


def _cmd(kind: str, sources: dict, out: Path) -> list[str]:
    if kind in ("dataset", "stream"):
        return [sys.executable, sources[kind], str(out)]
    return [sys.executable, "-m", "cachekit.cli", "build", sources[kind], "--out", str(out), *ARGS]


def _finished(out: Path) -> int:
    return len(list((out / PARTIAL_DIR).glob("shard-*.json"))) if (out / PARTIAL_DIR).is_dir() else 0


def _contents(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def _manifest(out: Path) -> dict:
    return read_manifest(out).to_json() | {"created": ""}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("kind", ["dataset", "stream", "parquet", "tar"])
def test_a_killed_build_resumes_byte_identical(sources, tmp_path, kind, sig):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent.parent), os.environ.get("PYTHONPATH")])),
    }
    clean = tmp_path / "clean"
    subprocess.run(_cmd(kind, sources, clean), check=True, capture_output=True, env=env)
    out = tmp_path / "cache"
    proc = subprocess.Popen(_cmd(kind, sources, out), start_new_session=True, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and _finished(out) < 2:
        time.sleep(0.002)
    if sig == signal.SIGKILL:
        os.killpg(proc.pid, sig)  # the build and its workers, as a crash would
    else:
        os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    assert proc.returncode != 0, "the build finished before it could be stopped"
    assert not (out / "manifest.json").exists()
    again = subprocess.run(_cmd(kind, sources, out), capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("resumed:"), again.stdout
    assert _contents(out) == _contents(clean)
    assert _manifest(out) == _manifest(clean)
    assert verify(out).ok
