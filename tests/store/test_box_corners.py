"""A stored box's corners are in order (x1 <= x2, y1 <= y2). A shard whose box has them swapped,
checksums recomputed, is named by verify and refused by ``ds[i]`` and the loaders, so a box of
negative width never reaches a loss; a box of no area (x1 == x2), which a build from code may
write, still reads."""

from __future__ import annotations

import numpy as np
import pytest
from manifests import tampered_copy

from cachekit import BuildConfig, CachedDataset, CacheError, build, make_loader, verify
from cachekit.tools.synthetic_objects import make_object_dataset


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A detection cache of 72x40 images at their own size, two shards of 6."""
    root = tmp_path_factory.mktemp("corners")
    make_object_dataset(root / "raw", 12, size=(40, 72), classes=5, most=4)
    config = BuildConfig(annotations="yolo", pipeline="none", shard_size=6, workers=1, progress=False)
    build(root / "raw", root / "cache", config)
    return root / "cache"


def _tampered(cache, tmp_path, change):
    """A copy of ``cache`` whose first shard's last box went through ``change``, checksums recomputed."""

    def last_box(columns):
        box = columns["boxes__boxes"][-1]
        assert box[2] > box[0] and box[3] > box[1]  # a real box with area, inside its image
        columns["boxes__boxes"][-1] = change(box.clone())

    return tampered_copy(cache, tmp_path / "c", last_box)


CHANGES = {
    "x swapped": lambda b: b[[2, 1, 0, 3]],
    "y swapped": lambda b: b[[0, 3, 2, 1]],
}


@pytest.mark.parametrize("case", list(CHANGES))
def test_a_box_with_its_corners_swapped_is_refused_by_every_read(cache, tmp_path, case):
    bad = _tampered(cache, tmp_path, CHANGES[case])
    report = verify(bad)
    assert not report.ok and len(report.problems) == 1
    assert "far corner comes before its near one" in report.problems[0].problem
    with pytest.raises(CacheError, match="far corner comes before its near one"):
        CachedDataset(bad)[0]  # sample 0 is fine: its shard is checked whole
    with pytest.raises(CacheError, match="far corner comes before its near one"):
        next(iter(make_loader(bad, 2, shuffle=False, pad=True)))
    ds = CachedDataset(bad)
    assert ds[int(ds.shard_offsets[1])][1]["boxes"].shape[1:] == (4,)  # the next shard reads


@pytest.mark.parametrize("axis", [0, 1])
def test_a_box_of_no_area_still_reads_and_verifies(cache, tmp_path, axis):
    def flat(b):
        b[axis + 2] = b[axis]  # x2 == x1 (or y2 == y1)
        return b

    ok = _tampered(cache, tmp_path, flat)
    assert verify(ok).ok
    ds = CachedDataset(ok)
    last = int(ds.shard_offsets[1]) - 1
    boxes = ds[last][1]["boxes"]
    assert (boxes[:, 2] >= boxes[:, 0]).all() and (boxes[:, 3] >= boxes[:, 1]).all()
    assert (boxes[:, axis + 2] == boxes[:, axis]).any()
    assert sum(len(batch[-1]) for batch in make_loader(ok, 4, shuffle=False, pad=True)) == len(ds)


@pytest.mark.parametrize(
    "box, bad",
    [
        ([10, 0, 5, 20], True),  # x2 < x1
        ([0, 10, 20, 5], True),  # y2 < y1
        ([10, 20, 30, 40], False),
        ([5, 30, 5, 40], False),  # no width
        ([30, 5, 40, 5], False),  # no height
    ],
)
def test_both_checks_compare_each_corner_with_its_own(box, bad):
    """verify's check and the readers' check, on boxes whose every other pairing of coordinates
    would tell a different story."""
    from cachekit.feed.targets import _check_values
    from cachekit.store.fields import FieldSpec
    from cachekit.tools.verify import _check_value

    value = {
        "boxes": np.array([[10, 20, 30, 40], box], dtype=np.float32),
        "classes": np.zeros(2, dtype=np.int64),
        "iscrowd": np.zeros(2, dtype=np.uint8),
    }
    found = _check_value("boxes", value, 5, (50, 50))
    assert (found is not None and "far corner comes before its near one" in found) == bad
    spec = FieldSpec("boxes", {})
    if bad:
        with pytest.raises(CacheError, match=rf"a box \[{box[0]}\.0, .* far corner"):
            _check_values("boxes", spec, [value], 5, np.array([[50, 50]]))
    else:
        _check_values("boxes", spec, [value], 5, np.array([[50, 50]]))
