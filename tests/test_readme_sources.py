"""The README's "From where your data already is" snippets run as written, on files made here."""

from __future__ import annotations

import io
import re
import sys
import types
from pathlib import Path

import cv2
import numpy as np
import pytest

from cachekit import CachedDataset, read_manifest

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## From where your data already is"


def _blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(HEADING) :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def _run_as_module(code: str, name: str) -> types.ModuleType:
    """Run ``code`` as an importable module, as a user's script is (its classes pickle by name)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(code, str(README), "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def _jpeg(rng, h=48, w=64) -> bytes:
    return cv2.imencode(".jpg", rng.integers(0, 255, (h, w, 3), dtype=np.uint8))[1].tobytes()


def test_the_readme_has_the_three_snippets():
    blocks = _blocks()
    assert len(blocks) == 2 and "class Pets" in blocks[0]
    assert "train-*.parquet" in blocks[1] and "{000000..000099}.tar" in blocks[1]


def test_a_torchvision_style_dataset_builds_as_the_readme_says(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    for k in range(6):
        folder = tmp_path / "pets" / ("cat", "dog")[k % 2]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k}.jpg").write_bytes(_jpeg(rng))
    monkeypatch.chdir(tmp_path)
    code = _blocks()[0].replace('BuildConfig(pipeline="classification-224")',
                                'BuildConfig(pipeline="classification-224", size=32, workers=2, progress=False)')  # fmt: skip
    module = _run_as_module(code, "readme_pets")
    assert module.result.manifest.classes == ("cat", "dog") and module.result.manifest.num_samples == 6
    ds = CachedDataset(tmp_path / "cache" / "pets")
    files = sorted((tmp_path / "pets").glob("*/*.jpg"))
    for i in range(len(ds)):
        assert ds[i][1] == ("cat", "dog").index(files[int(ds.source(i))].parent.name)


def test_parquet_and_tar_snippets_build_as_the_readme_says(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import json
    import tarfile

    import pyarrow.parquet as pq

    def add_member(tar, name, data):
        member = tarfile.TarInfo(name)
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))

    rng = np.random.default_rng(1)
    rows = [{"image": {"bytes": _jpeg(rng), "path": f"{i}.jpg"},
             "objects": {"bbox": [[4.0, 5.0, 20.0, 10.0]], "category": [i % 2]}} for i in range(5)]  # fmt: skip
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / "train-00000.parquet")
    (tmp_path / "shards").mkdir()
    for k in range(2):
        with tarfile.open(tmp_path / "shards" / f"train-{k:06d}.tar", "w") as tar:
            for i in range(3):
                add_member(tar, f"s{k}{i}.jpg", _jpeg(rng))
                add_member(tar, f"s{k}{i}.json", json.dumps({"label": i % 2}).encode())
    monkeypatch.chdir(tmp_path)
    code = _blocks()[1].replace("{000000..000099}", "{000000..000001}")
    code = code.replace(
        'BuildConfig(pipeline="letterbox-640")',
        'BuildConfig(pipeline="letterbox-640", size=64, workers=2, progress=False)',
    )
    _run_as_module(code, "readme_files")
    parquet, tars = read_manifest(tmp_path / "cache" / "parquet"), read_manifest(tmp_path / "cache" / "tars")
    assert parquet.num_samples == 5 and "boxes" in parquet.sample.fields and parquet.classes == ("0", "1")
    assert tars.num_samples == 6 and tars.classes == ("0", "1")
    _, target = CachedDataset(tmp_path / "cache" / "parquet")[0]
    assert target["boxes"].shape == (1, 4)
    # ds.source(i) names what docs/TRAINING.md's table says, for each kind of source
    table = _source_table()
    shapes = {"Parquet": r"[\w-]+\.parquet/\d+/\d+", "WebDataset": r"[\w-]+\.tar/[\w.-]+\.(jpg|png)"}
    for kind, shape in shapes.items():
        assert re.fullmatch(shape, table[kind]), (kind, table[kind])
    parquet_ds, tars_ds = (
        CachedDataset(tmp_path / "cache" / "parquet"),
        CachedDataset(tmp_path / "cache" / "tars"),
    )
    assert sorted(parquet_ds.source(i) for i in range(5)) == [f"train-00000.parquet/0/{r}" for r in range(5)]
    assert sorted(tars_ds.source(i) for i in range(6)) == [
        f"train-{k:06d}.tar/s{k}{i}.jpg" for k in range(2) for i in range(3)
    ]
    assert re.fullmatch(r"\d{12}", table["Python dataset"]) and re.fullmatch(r"[\w/]+\.jpg", table["folder"])


def _source_table() -> dict[str, str]:
    """docs/TRAINING.md's table of what ``ds.source(i)`` names: each kind's example, by a word of its row."""
    text = (README.parent / "docs" / "TRAINING.md").read_text(encoding="utf-8")
    section = text[text.index("What `ds.source(i)` names") :]
    rows = re.findall(r"^\| (.*?) \| .*? \| `(.*?)` \|$", section.split("\n\n")[1], re.M)
    found = {}
    for kind in ("folder", "Parquet", "WebDataset", "Python dataset"):
        (example,) = [ex for what, ex in rows if kind in what]
        found[kind] = example
    return found
