"""``preview`` draws keypoints: a dot in its object's class colour at each labelled point, none at an
unlabelled one, and the skeleton's lines between labelled points."""

from __future__ import annotations

import json

import numpy as np
from manifests import listed_manifest

import cachekit
from cachekit import BuildConfig, build
from cachekit.tools.preview import PALETTE

POINTS = np.array([[[20.5, 20.5, 2], [80.5, 20.5, 1], [50.5, 70.5, 2], [20.5, 70.5, 0]]], np.float32)


def test_points_and_skeleton_are_drawn_where_they_lie(tmp_path):
    image = np.zeros((100, 100, 3), np.uint8)
    target = {"boxes": np.array([[10, 10, 90, 90]], np.float32), "classes": [1], "keypoints": POINTS}
    build(
        [(image, target)], tmp_path / "c", BuildConfig(workers=1, progress=False, pipeline="none"), classes=2
    )
    manifest = listed_manifest(tmp_path / "c")
    manifest["sample"]["fields"]["keypoints"]["skeleton"] = [[0, 1], [3, 2]]
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
    result = cachekit.preview(tmp_path / "c", n=1, cell=200, out=tmp_path / "grid.png")
    grid, cell = result.image, result.cells[0]
    colour = np.array(PALETTE[1])

    def at(x, y):
        return grid[cell.y + int(y * cell.scale), cell.x + int(x * cell.scale)]

    for x, y, v in POINTS[0]:
        assert (at(x, y) == colour).all() == (v > 0), (x, y, v)
    assert (at(50.5, 20.5) == colour).all()  # the line 0-1, both labelled
    assert not (at(35.5, 70.5) == colour).all()  # 3-2: point 3 is not labelled
    assert not (at(35.5, 45.5) == colour).all()  # 0 and 2 are not joined


def test_an_array_field_shaped_like_points_is_not_drawn_as_points(tmp_path):
    """A float array field of shape [N, K, 3] (per-object normals, say) is no keypoints field: no dot."""
    image = np.zeros((100, 100, 3), np.uint8)
    normals = np.tile(np.float32([50.5, 50.5, 2]), (2, 2, 1))
    target = {"boxes": np.array([[10, 10, 30, 30]], np.float32), "classes": [1], "normals": normals}
    build(
        [(image, target)], tmp_path / "c", BuildConfig(workers=1, progress=False, pipeline="none"), classes=2
    )
    result = cachekit.preview(tmp_path / "c", n=1, cell=200, out=tmp_path / "grid.png")
    cell = result.cells[0]
    assert cell.target["normals"].shape == (2, 2, 3)
    x, y = cell.x + int(50.5 * cell.scale), cell.y + int(50.5 * cell.scale)
    assert (result.image[y - 4 : y + 5, x - 4 : x + 5] == 0).all()  # black image: nothing drawn there
