"""Letterboxed boxes map back to their annotations within half a pixel, through the per-axis scale
each sample records (``scale_xy``): the one nominal ``scale`` ignores each side's rounding."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build
from cachekit.image import ops

#: (height, width) of inputs whose rounded sides stray furthest from the nominal scale at 64.
SIZES = [(1001, 2000), (2000, 1003), (37, 1500), (640, 95)]


@pytest.mark.parametrize("hw", SIZES)
def test_the_recorded_per_axis_scale_is_what_each_side_got(hw):
    h, w = hw
    out, extras = ops.letterbox(np.full((h, w, 3), 200, np.uint8), 64)
    image = (out != 114).all(axis=2)  # the resized image inside the 114 padding
    rows, cols = np.flatnonzero(image.any(axis=1)), np.flatnonzero(image.any(axis=0))
    new_h, new_w = len(rows), len(cols)
    assert extras["pad"].tolist() == [cols[0], rows[0]]
    assert extras["scale_xy"].tolist() == pytest.approx([new_w / w, new_h / h], rel=1e-6)
    assert float(extras["scale"]) == pytest.approx(64 / max(h, w), rel=1e-6)


def test_boxes_map_back_within_half_a_pixel_where_the_nominal_scale_misses(tmp_path):
    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "labels").mkdir()
    (raw / "data.yaml").write_text("names: [thing]\n")
    truth = {}
    for i, (h, w) in enumerate(SIZES):
        cv2.imwrite(str(raw / "images" / f"{i}.png"), np.full((h, w, 3), 90, np.uint8))
        box = np.array([0.3 * w, 0.45 * h, w, h])  # out to the far corner, where rounding adds up
        cx, cy, bw, bh = (
            (box[0] + box[2]) / 2 / w,
            (box[1] + box[3]) / 2 / h,
            (box[2] - box[0]) / w,
            (box[3] - box[1]) / h,
        )
        (raw / "labels" / f"{i}.txt").write_text(f"0 {cx:.9f} {cy:.9f} {bw:.9f} {bh:.9f}\n")
        truth[f"images/{i}.png"] = box
    config = BuildConfig(annotations="yolo", pipeline="letterbox-640", size=64, workers=1, progress=False)
    build(raw, tmp_path / "c", config)
    ds = CachedDataset(tmp_path / "c")
    worst_nominal = 0.0
    for i in range(len(ds)):
        _, target = ds[i]
        extras = ds.extras(i)
        left, top = extras["pad"].astype(np.float64)
        stored = target["boxes"].numpy().astype(np.float64)[0]
        sx, sy = extras["scale_xy"].astype(np.float64)
        back = (stored - [left, top, left, top]) / [sx, sy, sx, sy]
        want = truth[ds.source(i)]
        assert np.abs(back - want).max() <= 0.5, (ds.source(i), back, want)
        nominal = (stored - [left, top, left, top]) / float(extras["scale"])
        worst_nominal = max(worst_nominal, np.abs(nominal - want).max())
    assert worst_nominal > 0.5  # these sizes are the ones where one scale is not enough
