"""A batch's boxes read flat: gathered per shard, moved at once, cut per sample; checked once a shard."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from manifests import listed_manifest

from cachekit import BuildConfig, CachedDataset, CacheError, build, make_loader
from cachekit.augment.plan import compile_plan
from cachekit.feed.batchtargets import read_objects
from cachekit.store.atomic import sha256_path
from cachekit.store.fields import ragged_rows
from cachekit.store.fields.base import ragged_gather
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import Letterbox, RandomHorizontalFlip, RandomResizedCrop


def _columns(counts: list[int], rng) -> dict[str, np.ndarray]:
    ends = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return {"v": rng.random((int(ends[-1]), 4)).astype(np.float32), "e": np.arange(ends[-1]), "o": ends}


@pytest.mark.parametrize("seed", range(5))
def test_gathered_rows_equal_each_rows_slice_with_and_without_a_memo(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 5, size=int(rng.integers(1, 30))).tolist()  # empty rows among them
    cols = _columns(counts, rng)
    column = lambda name, index: cols[name][index]  # noqa: E731
    rows = rng.integers(0, len(counts), size=int(rng.integers(0, 40))).tolist()  # repeats, any order
    memo: dict = {}
    for _ in range(2):  # the second call reads from the memo
        got, (values, extra) = ragged_gather(column, "v", "o", rows, len(counts), extra=("e",), memo=memo)
        assert got.tolist() == [counts[r] for r in rows]
        o = cols["o"]
        want = [cols["v"][o[r] : o[r + 1]] for r in rows]
        assert np.array_equal(values, np.concatenate(want) if want else np.zeros((0, 4), np.float32))
        assert np.array_equal(extra, np.concatenate([cols["e"][o[r] : o[r + 1]] for r in rows] or [[]]))
        pieces = ragged_rows(column, "v", "o", rows, len(counts), memo=memo)
        assert all(np.array_equal(p, w) for (p,), w in zip(pieces, want))
    pieces[0][0][...] = -1 if len(pieces) and len(pieces[0][0]) else 0  # a caller's own copy
    assert (cols["v"] >= 0).all()


def test_offsets_that_do_not_match_their_values_are_refused_and_never_remembered():
    rng = np.random.default_rng(0)
    cols = _columns([2, 3], rng)
    cols["o"] = np.array([0, 3, 2])  # runs down
    column = lambda name, index: cols[name][index]  # noqa: E731
    memo: dict = {}
    for _ in range(2):
        with pytest.raises(CacheError, match="do not match"):
            ragged_gather(column, "v", "o", [0], 2, memo=memo)
    assert not memo


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    root = tmp_path_factory.mktemp("flat")
    make_object_dataset(root / "raw", 24, size=(60, 80), classes=3, most=6)
    build(root / "raw", root / "c", BuildConfig(annotations="yolo", pipeline="none", shard_size=5,
                                                  workers=1, progress=False))  # fmt: skip
    return root / "c"


@pytest.mark.parametrize("seed", range(6))
def test_boxes_moved_for_the_batch_at_once_equal_each_sample_moved_alone(detection, seed):
    ds = CachedDataset(detection)
    steps = [RandomResizedCrop(32, scale=(0.1, 1.0)), RandomHorizontalFlip()] if seed % 2 else [Letterbox(48)]
    plan = compile_plan(steps, min_visibility=0.3)
    idx = np.random.default_rng(seed).permutation(len(ds))[:17]  # several shards, in any order
    with ds.borrowed_rows(idx) as (readers, local, _):
        hw = np.array(
            [r.column("image_shape", slice(i, i + 1))[0][1:] for r, i in zip(readers, local.tolist())]
        )
        draws = plan.draw(seed, 3, idx, hw[:, 0], hw[:, 1])
        objects = read_objects(ds.fields, ds._groups(idx, readers, local), len(ds.classes), ds.sample_shape)["boxes"]
        stored = [ds[int(i)][1]["boxes"] for i in idx]  # each sample's boxes as stored, in the read's order
    batch = draws.geometry().move_instances(objects, plan.min_visibility)
    moved = 0
    for j, ((a, b), (c, d)) in enumerate(zip(objects.spans(len(idx)), batch.spans(len(idx)))):
        assert np.array_equal(objects.boxes[a:b], np.asarray(stored[j]))  # read flat = read alone
        alone = objects.select(slice(a, b)).through(draws.affine(j).as_matrix(), draws.out_size, 0.3)
        for part in ("boxes", "classes", "iscrowd"):
            assert np.array_equal(getattr(batch, part)[c:d], getattr(alone, part)), (j, part)
        moved += len(alone)
    assert moved > 17  # boxes were there to move


def test_a_damaged_class_anywhere_in_a_shard_refuses_every_batch_that_reads_it(detection, tmp_path):
    import shutil

    cache = tmp_path / "c"
    shutil.copytree(detection, cache)
    manifest = listed_manifest(cache)
    info = manifest["shards"][0]
    path = cache / info["file"]
    columns = torch.load(path, weights_only=True)
    assert len(columns["boxes__classes"]) and int(columns["boxes__offsets"][1]) < len(
        columns["boxes__classes"]
    )
    columns["boxes__classes"][-1] = 99  # the shard's last box: not in sample 0
    torch.save(columns, path)
    info["bytes"], info["sha256"] = path.stat().st_size, sha256_path(path)
    (cache / "manifest.json").write_text(json.dumps(manifest))
    loader = make_loader(cache, 1, shuffle=False, augment=[Letterbox(48)])
    for _ in range(2):  # sample 0 alone, refused again: a failed check is never remembered as passed
        with pytest.raises(CacheError, match="out of range"):
            next(iter(loader))
    with pytest.raises(CacheError, match="out of range"):  # read alone too: the shard is checked whole
        CachedDataset(cache)[0]
    assert len(CachedDataset(cache)[info["samples"]][1]["boxes"]) >= 0  # the next shard reads


def test_an_empty_batch_and_a_grown_target_of_a_fixed_size_detection_cache(detection, tmp_path):
    raw = detection.parent / "raw"
    cache = tmp_path / "fixed"
    build(raw, cache, BuildConfig(annotations="yolo", pipeline="letterbox-640", size=64, shard_size=5,
                                  workers=1, progress=False))  # fmt: skip
    ds = CachedDataset(cache)
    images, _ = ds.read_batch([])
    assert images.shape == (0, 3, 64, 64)
    (x, targets), *_ = make_loader(cache, 4, shuffle=False, augment=[RandomHorizontalFlip()])
    first = targets[0]["boxes"]
    assert len(first) and len(targets[1]["boxes"])
    second = targets[1]["boxes"].clone()
    first.fill_(-1)
    assert torch.equal(targets[1]["boxes"], second)
    with pytest.raises(RuntimeError, match="not resizable"):  # a sample's boxes never grow into the next's
        first.resize_(len(first) + 1, 4)
