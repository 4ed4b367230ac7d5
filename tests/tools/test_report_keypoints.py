"""``cachekit info`` says how a mirror moves a cache's keypoints: its ``flip_idx`` with its values, or
that it has none (a flip then keeps each point's index)."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from cachekit import BuildConfig, build
from cachekit.cli import main

POINTS = np.array([[[50.0, 30.5, 2], [30.0, 60.5, 2], [70.0, 60.5, 2]]], np.float32)


def _info(out, **points) -> str:
    image = np.zeros((100, 100, 3), np.uint8)
    target = {"boxes": np.array([[10, 10, 90, 90]], np.float32), "classes": [0], "keypoints": POINTS}
    build(
        [(image, target)], out, BuildConfig(workers=1, progress=False, pipeline="none"), classes=1, **points
    )
    result = CliRunner().invoke(main, ["info", str(out)])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("fields:")]
    return line


def test_info_prints_flip_idx_with_its_values(tmp_path):
    line = _info(tmp_path / "named", keypoint_names=["nose", "left_eye", "right_eye"])
    assert "keypoints: 3 keypoints per box (float32 [N, 3, 3] x, y, visibility), flip_idx [0, 2, 1]" in line
    assert "flip_idx [2, 1, 0]" in _info(tmp_path / "given", flip_idx=[2, 1, 0])


def test_info_says_when_there_is_no_flip_idx(tmp_path):
    line = _info(tmp_path / "none")
    assert "visibility), no flip_idx (a flip keeps each point's index)" in line and "flip_idx [" not in line
