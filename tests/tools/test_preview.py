"""``cachekit.preview`` and ``cachekit preview``: a readable PNG with every target drawn where it lies."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

import cachekit
from cachekit import BuildConfig, build, make_loader
from cachekit.cli import main
from cachekit.errors import UsageError
from cachekit.tools.preview import PALETTE, caption_lines, draw_grid, preview
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

SPEC = "RandomResizedCrop(96, scale=(0.3, 1.0)), RandomHorizontalFlip()"


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    raw = make_object_dataset(tmp_path_factory.mktemp("preview") / "raw", 12, size=(120, 160), classes=3)
    out = raw.parent / "det"
    build(raw, out, BuildConfig(annotations="yolo", masks=str(raw / "masks"), pipeline="none", workers=1,
                                progress=False, min_visibility=0.0))  # fmt: skip
    return out


def _read_png(path) -> np.ndarray:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def test_boxes_are_drawn_where_the_targets_say_in_their_class_colour(detection, tmp_path):
    result = cachekit.preview(detection, SPEC, n=8, out=tmp_path / "grid.png", seed=3, cell=192)
    grid = _read_png(tmp_path / "grid.png")
    assert np.array_equal(grid, result.image)  # the file is the grid, losslessly
    checked = hits = 0
    for cell in result.cells:
        assert cell.scale == 2.0  # 96 -> 192
        boxes, classes = cell.target["boxes"].numpy(), cell.target["classes"].numpy()
        for (x1, y1, x2, y2), k in zip(boxes, classes):
            if min(x2 - x1, y2 - y1) * cell.scale < 8:
                continue
            colour = PALETTE[int(k)]
            left = (cell.y + round((y1 + y2) / 2 * cell.scale), cell.x + round(x1 * cell.scale))
            bottom = (cell.y + round(y2 * cell.scale) - 1, cell.x + round((x1 + x2) / 2 * cell.scale))
            for y, x in (left, bottom):
                checked += 1
                hits += tuple(grid[y, x]) == colour
    assert checked >= 10 and hits / checked >= 0.9, (hits, checked)
    empty = [c for c in result.cells if len(c.target["boxes"]) == 0]
    for cell in empty:  # no box drawn where there is none
        area = grid[cell.y : cell.y + cell.height * 2, cell.x : cell.x + cell.width * 2].reshape(-1, 3)
        assert not any((area == np.array(colour)).all(axis=1).any() for colour in PALETTE)


def test_masks_are_overlaid_in_their_class_colour(detection, tmp_path):
    result = preview(detection, SPEC, n=4, out=None, seed=1, cell=192)
    loader = make_loader(detection, 4, seed=1, augment=[RandomResizedCrop(96, scale=(0.3, 1.0)), RandomHorizontalFlip()],
                         workers=0, threads=1)  # fmt: skip
    images, targets = next(iter(loader))
    blended = checked = 0
    for j, cell in enumerate(result.cells):
        mask = targets[j]["mask"].numpy()
        inner = cv2.erode((mask > 0).astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
        for y, x in np.argwhere(inner)[::5]:
            source = images[j, :, y, x].numpy().astype(np.float64)
            want = 0.55 * source + 0.45 * np.array(PALETTE[int(mask[y, x]) - 1])
            got = result.image[cell.y + 2 * y, cell.x + 2 * x].astype(np.float64)
            if tuple(got) in PALETTE:  # under a box's line
                continue
            tags = targets[j]["boxes"].numpy()  # each box's name tag: at its top left, about 8 px high
            if any(x1 - 1 <= x <= x1 + 48 and y1 - 9 <= y <= y1 + 9 for x1, y1, _, _ in tags):
                continue
            checked += 1
            blended += np.abs(got - want).max() <= 1.5  # else under a box's name tag (its text)
    assert blended > 20 and blended / checked >= 0.9, (blended, checked)


def test_classification_labels_soft_labels_multi_labels_and_captions_are_written():
    classes = ["cat", "dog", "bird"]
    assert caption_lines({"label": 1}, classes, 256) == ["dog"]
    assert caption_lines({"soft": torch.tensor([0.1, 0.6, 0.3])}, classes, 256) == ["dog 0.60 + bird 0.30"]
    assert caption_lines({"labels": torch.tensor([0, 2])}, classes, 256) == ["cat, bird"]
    lines = caption_lines({"text": "a cat on a mat " * 10}, classes, 128)
    assert 1 < len(lines) <= 3 and lines[-1].endswith("...")
    images = torch.zeros(3, 3, 32, 32, dtype=torch.uint8)
    bare, _ = draw_grid(images, [{}, {}, {}], classes, cell=64)
    written, cells = draw_grid(
        images, [{"label": 0}, {"soft": torch.tensor([0.5, 0.5, 0.0])}, {"text": "hello"}], classes, cell=64
    )
    assert written.shape[0] > bare.shape[0]  # a band for the words under each image
    for cell in cells:  # white text in each band
        band = written[cell.y + 64 : cell.y + 64 + 16, cell.x : cell.x + 64]
        assert band.max() > 200


def test_a_loader_is_previewed_with_its_own_plan_and_seed(small_cache, tmp_path):
    loader = make_loader(small_cache, 8, seed=11, augment=[RandomResizedCrop(20)])
    result = preview(loader, n=4, out=tmp_path / "a.png")
    assert "RandomResizedCrop(20)" in result.title and "seed 11" in result.title
    assert all((c.height, c.width) == (20, 20) for c in result.cells)
    loader.set_augment([RandomResizedCrop(12)])  # the loader's next epoch
    assert all((c.height, c.width) == (12, 12) for c in preview(loader, n=4, out=None).cells)
    assert all(isinstance(c.target["label"], int) for c in result.cells)


def test_hostile_arguments_are_refused_in_one_line(detection, tmp_path):
    for spec in (
        '__import__("os").system("true")',
        "RandomResizedCrop(2**40)",
        "Nope()",
        "RandomResizedCrop(-3)",
    ):
        with pytest.raises(ValueError) as info:
            preview(detection, spec, out=None)
        assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match="n must be"):
        preview(detection, SPEC, n=0, out=None)
    with pytest.raises(UsageError, match=".png"):
        preview(detection, SPEC, out=tmp_path / "grid.exe")
    with pytest.raises(UsageError, match="no folder"):
        preview(detection, SPEC, out=tmp_path / "missing" / "grid.png")


def test_the_command_writes_a_png_and_refuses_a_hostile_spec_in_one_line(detection, tmp_path):
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(
        main, ["preview", str(detection), "--augment", SPEC, "--out", str(out), "-n", "4"]
    )
    assert result.exit_code == 0, result.output
    assert "written" in result.output and _read_png(out).shape[2] == 3
    marker = tmp_path / "pwned"
    hostile = f"RandomHorizontalFlip(), __import__('os').system('touch {marker}')"
    result = CliRunner().invoke(main, ["preview", str(detection), "--augment", hostile, "--out", str(out)])
    assert result.exit_code == 2 and not marker.exists()
    assert "Traceback" not in result.output and "augment spec" in result.output
    result = CliRunner().invoke(
        main, ["preview", str(detection), "--augment", "Resize(64)", "--out", str(out)]
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "fixed size" in result.output


def test_a_huge_column_count_is_refused_not_allocated(detection, tmp_path):
    # --columns 100000 drew a canvas 100000 cells wide (the process was killed for memory)
    with pytest.raises(UsageError, match="columns must be an integer from 1 to 256"):
        preview(detection, SPEC, n=4, out=None, columns=100_000)
    result = CliRunner().invoke(
        main, ["preview", str(detection), "--columns", "100000", "--out", str(tmp_path / "g.png")]
    )
    assert result.exit_code != 0 and "columns must be" in result.output and not (tmp_path / "g.png").exists()
    # more columns than samples: one row of just the samples, no empty cells
    wide = preview(detection, SPEC, n=3, out=None, columns=200, cell=32)
    narrow = preview(detection, SPEC, n=3, out=None, columns=3, cell=32)
    assert wide.image.shape == narrow.image.shape


def test_the_png_replaces_the_old_one_whole_and_leaves_nothing_beside_it(detection, tmp_path, monkeypatch):
    out = tmp_path / "grid.png"
    out.write_bytes(b"an older grid")
    preview(detection, SPEC, n=4, out=out, cell=32)
    assert _read_png(out).shape[2] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]
    # a write that fails half-way leaves the old file as it was, and no temp file
    before = out.read_bytes()

    def broken(self, data):  # half the bytes, then the disk fills
        with open(self, "wb") as fh:
            fh.write(bytes(data)[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", broken)
    with pytest.raises(UsageError, match="No space left"):
        preview(detection, SPEC, n=4, out=out, cell=32)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]


def test_a_grid_too_large_to_look_at_is_refused_before_it_is_drawn(detection):
    # 12 samples of 2048 px in one row: a 24,000-pixel-wide canvas (256 samples of 2048 px: 3 GB)
    with pytest.raises(UsageError, match="px on a side"):
        preview(detection, SPEC, n=12, cell=2048, columns=12, out=None)
    assert preview(detection, SPEC, n=4, cell=2048, out=None).image.shape[1] <= 16384


SMALL_CROPS = [RandomResizedCrop(96, scale=(0.1, 0.3))]  # most boxes keep little of their area


def _box_counts(result) -> list[int]:
    return [len(c.target["boxes"]) for c in result.cells]


def test_the_loaders_min_visibility_drops_boxes_in_the_preview_as_in_training(detection, tmp_path):
    loader = make_loader(detection, 8, seed=5, augment=SMALL_CROPS, min_visibility=0.9, workers=0, threads=1)
    _, trained = next(iter(make_loader(detection, 8, seed=5, augment=SMALL_CROPS, min_visibility=0.9,
                                       workers=0, threads=1)))  # fmt: skip
    loose = preview(detection, SMALL_CROPS, n=8, out=None, seed=5, min_visibility=0.0)
    for shown in (preview(loader, n=8, out=None), preview(loader, SMALL_CROPS, n=8, out=None)):
        # the loader's own plan, or transforms given to preview: its min_visibility either way
        assert _box_counts(shown) == [len(t["boxes"]) for t in trained]
        for cell, target in zip(shown.cells, trained):
            assert torch.equal(cell.target["boxes"], target["boxes"])
        assert sum(_box_counts(shown)) < sum(_box_counts(loose))  # boxes a crop hides are not drawn
        assert not np.array_equal(shown.image, loose.image)
    # the command line takes it too
    out = tmp_path / "g.png"
    spec = "RandomResizedCrop(96, scale=(0.1, 0.3))"
    args = ["preview", str(detection), "--augment", spec, "-n", "8", "--seed", "5", "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--min-visibility", "0.9"])
    assert result.exit_code == 0, result.output
    assert np.array_equal(_read_png(out), preview(loader, n=8, out=None).image)
    result = CliRunner().invoke(main, [*args, "--min-visibility", "1.5"])
    assert result.exit_code == 2 and "min_visibility" in result.output and "Traceback" not in result.output


def test_a_loader_is_previewed_with_the_plan_of_the_epoch_shown(detection):
    def schedule(epoch):  # the plan changes at epoch 2
        return [RandomResizedCrop(96)] if epoch < 2 else [RandomResizedCrop(48)]

    loader = make_loader(detection, 4, seed=1, augment=schedule, workers=0, threads=1)
    for _ in loader:  # epoch 0
        pass
    asked = preview(loader, n=2, out=None, epoch=2)
    assert "epoch 2" in asked.title and "RandomResizedCrop(48)" in asked.title
    assert all((c.height, c.width) == (48, 48) for c in asked.cells)
    assert "RandomResizedCrop(96)" in preview(loader, n=2, out=None).title  # its next: epoch 1
    for _ in loader:  # epoch 1 ends: the next one is 2
        pass
    upcoming = preview(loader, n=2, out=None)
    assert "epoch 2" in upcoming.title and all((c.height, c.width) == (48, 48) for c in upcoming.cells)
    assert np.array_equal(upcoming.image, asked.image)
    again = preview(loader, n=2, out=None, epoch=1)
    assert "RandomResizedCrop(96)" in again.title and again.cells[0].height == 96
    for bad in (-1, 1.5, True):
        with pytest.raises(UsageError, match="epoch must be an integer"):
            preview(loader, n=2, out=None, epoch=bad)
