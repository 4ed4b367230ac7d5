"""``preview`` draws keypoints: a dot in its index's colour at each labelled point (so left and right
differ, and a flip that swaps them by ``flip_idx`` keeps each side's colour while one without it
shows the swap), none at an unlabelled one, the skeleton's lines between labelled points in the
object's class colour, and a legend of index, name and mirror partner -> colour under the grid."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from manifests import listed_manifest

import cachekit
from cachekit import BuildConfig, build
from cachekit.tools.preview import PALETTE
from cachekit.tools.previewpoints import (
    POINT_PALETTE,
    draw_legend,
    legend_entries,
    legend_height,
    point_colour,
)
from cachekit.transforms import RandomHorizontalFlip, Resize

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

    for k, (x, y, v) in enumerate(POINTS[0]):
        assert (at(x, y) == point_colour(k)).all() == (v > 0), (k, x, y, v)
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


#: A face seen from the front: a nose, then the left and right eyes (the subject's), which a mirror swaps.
FACE = np.array([[[50.0, 30.5, 2], [30.0, 60.5, 2], [70.0, 60.5, 2]]], np.float32)
LEFT, RIGHT = (30.0, 60.5), (70.0, 60.5)  # each where the other goes in a mirror (x -> 100 - x)
MIRROR = [RandomHorizontalFlip(1.0), Resize((100, 100))]  # the whole image, mirrored, at its own size


def _face_cache(out, **points):
    image = np.zeros((100, 100, 3), np.uint8)
    target = {"boxes": np.array([[10, 10, 90, 90]], np.float32), "classes": [0], "keypoints": FACE}
    build(
        [(image, target)], out, BuildConfig(workers=1, progress=False, pipeline="none"), classes=1, **points
    )
    return out


def _colours_at(path, cell, *points) -> list[tuple[int, ...]]:
    """The colours the PNG written to ``path`` has at ``points`` of the sample in ``cell``."""
    png = cv2.imread(str(path), cv2.IMREAD_COLOR)[..., ::-1]  # read back from the file, as RGB
    return [
        tuple(int(c) for c in png[cell.y + int(y * cell.scale), cell.x + int(x * cell.scale)])
        for x, y in points
    ]


def test_each_index_has_its_colour_and_a_flip_by_flip_idx_keeps_left_and_right_apart(tmp_path):
    cache = _face_cache(tmp_path / "c", keypoint_names=["nose", "left_eye", "right_eye"])
    assert len(set(POINT_PALETTE)) == len(POINT_PALETTE) and (255, 255, 255) not in POINT_PALETTE
    shown = cachekit.preview(cache, n=1, cell=200, out=tmp_path / "plain.png")
    nose, left, right = _colours_at(tmp_path / "plain.png", shown.cells[0], FACE[0, 0, :2], LEFT, RIGHT)
    assert (nose, left, right) == (point_colour(0), point_colour(1), point_colour(2)) and left != right
    # mirrored: each eye moves to the other side and flip_idx swaps their indices, so each side
    # keeps its index's colour, as in every unmirrored sample
    flipped = cachekit.preview(cache, MIRROR, n=1, cell=200, out=tmp_path / "flip.png")
    assert _colours_at(tmp_path / "flip.png", flipped.cells[0], LEFT, RIGHT) == [left, right]


@pytest.mark.filterwarnings("ignore:keypoints .* no flip_idx:UserWarning")  # said once a process
def test_a_flip_without_flip_idx_shows_its_points_on_the_wrong_side(tmp_path):
    cache = _face_cache(tmp_path / "c", keypoint_names=["nose", "eye_a", "eye_b"])
    flipped = cachekit.preview(cache, MIRROR, n=1, cell=200, out=tmp_path / "f.png")
    # no swap: each point keeps its index, so the colours change sides, where a reader sees them
    assert _colours_at(tmp_path / "f.png", flipped.cells[0], LEFT, RIGHT) == [
        point_colour(2),
        point_colour(1),
    ]


def test_the_legend_names_each_index_its_mirror_and_shows_its_colour(tmp_path):
    cache = _face_cache(tmp_path / "c", keypoint_names=["nose", "left_eye", "right_eye"])
    result = cachekit.preview(cache, n=1, cell=200, out=tmp_path / "grid.png")
    assert result.legend == ["0 nose", "1 left_eye <> 2", "2 right_eye <> 1"]
    png = cv2.imread(str(tmp_path / "grid.png"), cv2.IMREAD_COLOR)[..., ::-1]
    below = png[result.cells[0].y + 200 :].reshape(-1, 3)  # under the sample: the legend
    for k in range(3):
        assert (below == point_colour(k)).all(axis=1).sum() >= 20, k  # its dot, a few pixels wide
    unnamed = cachekit.preview(_face_cache(tmp_path / "u", flip_idx=[0, 2, 1]), n=1, cell=200, out=None)
    assert unnamed.legend == ["0", "1 <> 2", "2 <> 1"]
    boxes_only = (
        np.zeros((60, 60, 3), np.uint8),
        {"boxes": np.array([[5, 5, 30, 30]], np.float32), "classes": [0]},
    )
    build([boxes_only], tmp_path / "b", BuildConfig(workers=1, progress=False, pipeline="none"), classes=1)
    plain = cachekit.preview(tmp_path / "b", n=1, cell=200, out=None)
    assert plain.legend == [] and plain.image.shape[0] == plain.cells[0].y + 200 + 6  # no band for a legend


def test_every_index_of_a_large_skeleton_has_a_colour_of_its_own_and_the_legend_wraps():
    colours = [point_colour(k) for k in range(68)]  # a face's 68 landmarks
    assert len(set(colours)) == 68 and colours[: len(POINT_PALETTE)] == list(POINT_PALETTE)
    assert all(all(0 <= c <= 255 for c in rgb) for rgb in colours) and (255, 255, 255) not in colours
    entries = legend_entries({"face": {"k": 68, "names": [f"p{i}" for i in range(68)]}})
    assert [label for _, label in entries[:2]] == ["0 p0", "1 p1"] and len(entries) == 68
    one_line = legend_height(entries[:1], 400)
    assert one_line > 0 and legend_height(entries, 400) > 5 * one_line and legend_height([], 400) == 0
    canvas = np.zeros((legend_height(entries, 400), 400, 3), np.uint8)
    draw_legend(canvas, entries, 0)
    drawn = {tuple(int(c) for c in px) for px in canvas.reshape(-1, 3)}
    assert set(colours) <= drawn  # every dot drawn within the canvas, none past its right edge
