"""Stored field values are checked where they are read: per shard once, when it is first opened.

A cache whose checksums were recomputed after tampering passes the manifest's checks; its values
must still never reach a model: boxes outside their image, crowd flags past 1, image classes past
the cache's classes are a CacheError from ``ds[i]`` and ``make_loader`` alike (and named by verify).
"""

from __future__ import annotations

import pytest
import torch
from manifests import tampered_copy

from cachekit import BuildConfig, CachedDataset, CacheError, build, make_loader, verify
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import Letterbox


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """A detection cache of images at their own size (72x40) and one letterboxed to 48x48."""
    root = tmp_path_factory.mktemp("ranges")
    make_object_dataset(root / "raw", 12, size=(40, 72), classes=5, most=4)
    out = {}
    for name, pipeline in (("own", "none"), ("fixed", "letterbox-640")):
        size = {"size": 48} if pipeline != "none" else {}
        config = BuildConfig(
            annotations="yolo", pipeline=pipeline, shard_size=6, workers=1, progress=False, **size
        )
        build(root / "raw", root / name, config)
        out[name] = root / name
    return out


def _tampered(cache, tmp_path, change):
    """A copy of ``cache`` whose first shard's columns went through ``change``, checksums recomputed."""
    return tampered_copy(cache, tmp_path / "c", change)


def _last_box(part, value):
    def change(columns):
        columns[f"boxes__{part}"][-1] = value  # the shard's last box: not sample 0's

    return change


CASES = {
    "box far right": (_last_box("boxes", torch.tensor([1e6, 0, 1e6 + 5, 4])), "outside its"),
    "box far up": (_last_box("boxes", torch.tensor([2, -50, 8, -40])), "outside its"),
    "iscrowd 7": (_last_box("iscrowd", 7), "iscrowd flag of 7"),
    "image class 99": (lambda cols: cols["labels"].__setitem__(-1, 99), "99, the cache has 5 classes"),
}


@pytest.mark.parametrize("kind", ["own", "fixed"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_value_is_refused_by_every_read(caches, tmp_path, kind, case):
    change, message = CASES[case]
    if case == "image class 99":
        message = "99, the cache has"
    cache = _tampered(caches[kind], tmp_path, change)
    with pytest.raises(CacheError, match=message):
        CachedDataset(cache)[0]  # sample 0 is fine: its shard is checked whole
    with pytest.raises(CacheError, match=message):
        next(iter(make_loader(cache, 2, shuffle=False, pad=kind == "own")))
    with pytest.raises(CacheError, match=message):
        next(iter(make_loader(cache, 2, shuffle=False, augment=[Letterbox(32)])))
    ds = CachedDataset(cache)
    assert ds[int(ds.shard_offsets[1])][1]["boxes"].shape[1:] == (4,)  # the next shard reads


@pytest.mark.parametrize("kind", ["own", "fixed"])
def test_untampered_caches_read_and_their_boxes_lie_inside_their_images(caches, kind):
    ds = CachedDataset(caches[kind])
    for i in range(len(ds)):
        image, target = ds[i]
        h, w = image.shape[-2:]
        b = target["boxes"]
        assert (b[:, :2] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
        assert set(target["iscrowd"].tolist()) <= {0, 1}
    assert sum(
        len(batch[-1]) for batch in make_loader(caches[kind], 4, shuffle=False, pad=kind == "own")
    ) == len(ds)


@pytest.mark.parametrize("case", ["box far right", "iscrowd 7"])
def test_verify_names_a_tampered_box_or_crowd_flag(caches, tmp_path, case):
    change, _ = CASES[case]
    report = verify(_tampered(caches["own"], tmp_path, change))
    assert not report.ok
    want = "outside its" if case.startswith("box") else "iscrowd flag that is not 0 or 1"
    assert want in report.problems[0].problem
