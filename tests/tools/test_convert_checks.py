"""``convert`` checks the values it copies as verify does (and as it checks pixels): a shard whose
checksums were recomputed after its fields were damaged is refused, never copied into a cache that
verify then fails."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from manifests import listed_manifest

from cachekit import BuildConfig, CacheError, build, verify
from cachekit.cli import main
from cachekit.store.atomic import sha256_path
from cachekit.store.fields import encode_mask
from cachekit.tools.convert import convert
from cachekit.tools.synthetic_objects import make_object_dataset

QUIET = {"workers": 1, "progress": False, "pipeline": "none", "shard_size": 100}


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """``fields``: YOLO boxes, masks and an array per image; ``text``: a label and a caption."""
    root = tmp_path_factory.mktemp("convert-checks")
    raw = make_object_dataset(root / "raw", 6, size=(40, 60), classes=3)
    images = sorted((raw / "images").iterdir())
    (root / "npy" / "images").mkdir(parents=True)
    for i, p in enumerate(images):  # each its own length: a ragged array field
        np.save(root / "npy" / "images" / f"{p.stem}.npy", np.arange(i + 2, dtype=np.float32))
    csv = root / "l.csv"
    csv.write_text(
        "file,label,caption\n"
        + "".join(f"images/{p.name},c{i % 2},hello {i}\n" for i, p in enumerate(images))
    )
    arrays = {"emb": str(root / "npy")}
    build(
        raw,
        root / "fields",
        BuildConfig(annotations="yolo", masks=str(raw / "masks"), arrays=arrays, **QUIET),
    )
    build(raw, root / "text", BuildConfig(labels=str(csv), **QUIET))
    return root


def _replace_ragged(columns, values: str, offsets: str, first: np.ndarray) -> None:
    """Row 0's bytes of a ragged column replaced by ``first``, the offsets kept consistent."""
    data, ends = columns[values].numpy(), columns[offsets].numpy()
    columns[values] = torch.from_numpy(np.concatenate([first, data[ends[1] :]]))
    columns[offsets] = torch.from_numpy(np.concatenate([[0], ends[1:] - ends[1] + len(first)]))


def _bomb(columns) -> None:
    _replace_ragged(columns, "mask__png", "mask__offsets", encode_mask(np.zeros((20000, 20000), np.uint8)))


def _offsets_backwards(columns) -> None:
    columns["boxes__offsets"][2] = columns["boxes__offsets"][1] - 1


def _array_shape(columns) -> None:
    columns["emb__shapes"][0, 0] = 50  # no row holds 50 values


def _not_utf8(columns) -> None:
    _replace_ragged(columns, "text__utf8", "text__offsets", np.frombuffer(b"\xff\xfe bad", np.uint8))


def _label(columns) -> None:
    columns["labels"][-1] = 99


DAMAGES = {
    "mask bomb": ("fields", _bomb, "20000x20000"),
    "offsets": ("fields", _offsets_backwards, "offsets"),
    "array": ("fields", _array_shape, "does not have the shape [50]"),
    "text": ("text", _not_utf8, "UTF-8"),
    "label": ("text", _label, "label outside"),
}


def _damaged(caches, tmp_path, which, change):
    copy = tmp_path / "src"
    shutil.copytree(caches / which, copy)
    manifest = listed_manifest(copy)
    info = manifest["shards"][0]
    path = copy / info["file"]
    columns = torch.load(path, weights_only=True)
    change(columns)
    torch.save(columns, path)
    info["bytes"], info["sha256"] = path.stat().st_size, sha256_path(path)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_convert_refuses_a_damaged_field_as_verify_names_it(caches, tmp_path, damage):
    which, change, words = DAMAGES[damage]
    src = _damaged(caches, tmp_path, which, change)
    problem = verify(src).problems[0].problem
    assert words in problem, problem
    with pytest.raises(CacheError, match="convert copies only what verify passes"):
        convert(src, tmp_path / "out", "hdf5")
    assert not (tmp_path / "out" / "manifest.json").exists()
    result = CliRunner().invoke(
        main, ["convert", str(src), "--to", "zarr", "--out", str(tmp_path / "out2"), "--quiet"]
    )
    assert result.exit_code == 1 and "convert copies only what verify passes" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("which", ["fields", "text"])
def test_an_intact_cache_converts_and_verifies(caches, tmp_path, which):
    convert(caches / which, tmp_path / "out", "hdf5")
    assert verify(tmp_path / "out").ok


def test_convert_refuses_an_index_whose_bytes_changed(small_cache, tmp_path):
    """A NaN pixel sum in the index passes the index's structural checks; converting it would carry
    NaN statistics into a new index with a fresh, matching sha256."""
    src = tmp_path / "src"
    shutil.copytree(small_cache, src)
    path = src / json.loads((src / "manifest.json").read_text())["index"]["file"]
    data = bytearray(path.read_bytes())
    header = json.loads(bytes(data[16 : 16 + int.from_bytes(data[12:16], "little")]))
    at = next(c["offset"] for c in header["columns"] if c["name"] == "pixel_sum")
    data[at : at + 8] = np.array([np.nan], dtype="<f8").tobytes()
    path.write_bytes(bytes(data))
    assert not verify(src).ok
    with pytest.raises(CacheError, match="shard index's bytes do not match"):
        convert(src, tmp_path / "out", "pt", progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()
