"""Hostile raw trees: loops, FIFOs, devices, bombs, odd names. A build finishes and says why it skipped."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, discover, read_manifest
from cachekit.build import inputs
from cachekit.build.headers import image_size
from cachekit.build.shardjob import read_input
from cachekit.image.ops import DecodeError
from cachekit.tools.synthetic import synthetic_image


def _jpeg(rng, h=40, w=48) -> bytes:
    return cv2.imencode(".jpg", synthetic_image(rng, h, w)[..., ::-1])[1].tobytes()


def _png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header claims ``width`` x ``height`` (a decompression bomb's shape)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 4096)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


#: Every hostile entry of the tree below, with a word of the reason it must be skipped for.
HOSTILE = {
    "cat/fifo.jpg": "FIFO",
    "cat/zero.jpg": "device",
    "cat/bomb.png": "max-pixels",
    "cat/thin.png": "aspect ratio",
    "cat/huge.tif": "byte limit",
    "cat/claims-tiff.tif": "decodable",
    "cat/gif-inside.jpg": "decodable",
    "cat/dangling.jpg": "dangling",
    "cat/loop": "back into RAW",
    "cat/deeper/up": "back into RAW",
    "dog/root": "holds RAW",
    "dog/selfloop.jpg": "symlink loop",
}


@pytest.fixture(scope="module")
def hostile_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "raw"
    rng = np.random.default_rng(3)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            (root / cls / f"ok{i}.jpg").write_bytes(_jpeg(rng))
    (root / "cat" / "deeper").mkdir()
    (root / "cat" / "deeper" / "ok.png").write_bytes(
        cv2.imencode(".png", synthetic_image(rng, 30, 20))[1].tobytes()
    )
    os.mkfifo(root / "cat" / "fifo.jpg")
    os.symlink("/dev/zero", root / "cat" / "zero.jpg")
    (root / "cat" / "bomb.png").write_bytes(_png_claiming(30000, 30000))
    (root / "cat" / "thin.png").write_bytes(
        cv2.imencode(".png", np.zeros((1, 65000, 3), np.uint8))[1].tobytes()
    )
    with open(root / "cat" / "huge.tif", "wb") as fh:  # sparse: 6 GB on paper, nothing on disk
        fh.write(b"II*\x00\x08\x00\x00\x00")
        fh.truncate(6 * 10**9)
    (root / "cat" / "claims-tiff.tif").write_bytes(b"II*\x00\xff\xff\xff\x7f" + b"\0" * 64)
    (root / "cat" / "gif-inside.jpg").write_bytes(b"GIF89a" + b"\0" * 100)
    os.symlink(root / "gone.jpg", root / "cat" / "dangling.jpg")
    os.symlink(root / "cat", root / "cat" / "loop")  # a loop on itself
    os.symlink("../..", root / "cat" / "deeper" / "up")  # a loop two levels up
    os.symlink("/", root / "dog" / "root")  # ln -s /
    os.symlink(root / "dog" / "selfloop.jpg", root / "dog" / "selfloop.jpg")
    for name in ("anim.gif", "photo.heic", "scan.jp2"):
        (root / "dog" / name).write_bytes(b"not read")
    odd = os.fsencode(root / "dog") + b"/caf\xe9-\xff.jpg"  # Latin-1 bytes: not UTF-8
    with open(odd, "wb") as fh:
        fh.write(_jpeg(rng))
    return root


def test_every_hostile_input_is_skipped_with_its_reason(hostile_tree, tmp_path):
    # the default recipe (shorter side 256) would make the 65000 x 1 PNG 16.6M x 256 pixels
    result = build(hostile_tree, tmp_path / "c", BuildConfig(workers=2, progress=False))
    m = read_manifest(tmp_path / "c")
    reasons = {s.path: s.reason for s in m.skipped}
    for path, word in HOSTILE.items():
        assert word in reasons.get(path, ""), (path, reasons.get(path))
    assert set(reasons) == set(HOSTILE)
    assert m.num_samples == 8  # 7 good files and the non-UTF-8 name
    assert m.source["unread"] == {".gif": 1, ".heic": 1, ".jp2": 1}
    assert "1 .gif, 1 .heic, 1 .jp2 not read" in result.summary()


def test_non_utf8_names_are_read_and_recorded_byte_for_byte(hostile_tree, tmp_path):
    build(hostile_tree, tmp_path / "c", BuildConfig(size=16, workers=1, progress=False))
    ds = CachedDataset(tmp_path / "c")
    sources = [ds.source(i) for i in range(len(ds))]
    odd = [s for s in sources if s.startswith("dog/caf")]
    assert len(odd) == 1 and os.fsencode(odd[0]) == b"dog/caf\xe9-\xff.jpg"
    assert (hostile_tree / odd[0]).is_file()  # the path opens the very file
    (tmp_path / "c" / "manifest.json").read_bytes().decode("utf-8")  # the manifest stays valid UTF-8
    assert read_manifest(tmp_path / "c").shards  # and parses back


def test_discovery_of_loops_and_links_to_root_finishes(hostile_tree):
    source = discover(hostile_tree)
    # the 8 good files and 5 regular files skipped later for their content, each found once
    assert len(source) == len(set(source.paths)) == 8 + 5
    assert source.classes == ("cat", "dog")


def test_a_fifo_swapped_in_after_discovery_does_not_hang(tmp_path):
    os.mkfifo(tmp_path / "late.jpg")
    with pytest.raises(DecodeError, match="not a regular file"):
        read_input(tmp_path / "late.jpg")


def test_headers_give_the_size_of_every_format_read(tmp_path):
    rng = np.random.default_rng(0)
    img = synthetic_image(rng, 37, 53)[..., ::-1]
    for ext, params in {
        ".jpg": [],
        ".png": [],
        ".bmp": [],
        ".tiff": [],
        ".webp": [cv2.IMWRITE_WEBP_QUALITY, 101],
    }.items():
        assert image_size(cv2.imencode(ext, img, params)[1].tobytes()) == (37, 53), ext
    assert image_size(cv2.imencode(".webp", img, [cv2.IMWRITE_WEBP_QUALITY, 80])[1].tobytes()) == (37, 53)
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(img)).save(tmp_path / "big.tif", big_tiff=True)
    assert image_size((tmp_path / "big.tif").read_bytes()) == (37, 53)


def test_decode_failures_of_any_kind_are_skips_not_aborts(tmp_path, monkeypatch):
    """cv2.error, MemoryError and ValueError while decoding one input skip that input only."""
    from cachekit.image import ops

    raw = tmp_path / "raw"
    (raw / "a").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for k, name in enumerate(("cv.jpg", "memory.jpg", "value.jpg", "fine.jpg")):
        (raw / "a" / name).write_bytes(_jpeg(rng, 40 + 16 * k, 48 + 16 * k))  # told apart by size
    real = ops.decode

    def flaky(data, reduce=1):
        size = len(data)
        if size == (raw / "a" / "cv.jpg").stat().st_size:
            raise cv2.error("OpenCV(4) error: (-215:Assertion failed)")
        if size == (raw / "a" / "memory.jpg").stat().st_size:
            raise MemoryError()
        if size == (raw / "a" / "value.jpg").stat().st_size:
            raise ValueError("odd")
        return real(data, reduce)

    monkeypatch.setattr(inputs, "decode", flaky)
    build(raw, tmp_path / "c", BuildConfig(size=16, workers=1, progress=False))
    reasons = {s.path: s.reason for s in read_manifest(tmp_path / "c").skipped}
    assert "OpenCV" in reasons["a/cv.jpg"] and "out of memory" in reasons["a/memory.jpg"]
    assert "ValueError" in reasons["a/value.jpg"] and "a/fine.jpg" not in reasons


def test_every_recipe_op_says_how_big_its_output_is():
    """The pixel limit follows the recipe's images through every op, so every op must say its size."""
    from cachekit.image import recipes

    assert set(recipes.OPS) == set(recipes._OUTPUT_HW)
    pipeline = recipes.load_pipeline("classification-224")
    assert pipeline.peak_pixels(1, 65000) == 256 * 256 * 65000
    assert pipeline.peak_pixels(375, 500) == 375 * 500  # the input itself is the largest
