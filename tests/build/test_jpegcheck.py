"""JPEGs cut short and given an end marker: decoded "successfully" with grey blocks, skipped by a build."""

from __future__ import annotations

import io
import os

import cv2
import numpy as np
import pytest
from PIL import Image

from cachekit import BuildConfig, CachedDataset, build, read_manifest
from cachekit.build.inputs import decode_input
from cachekit.build.jpegcheck import decoder_messages, missing_data, structure_problem
from cachekit.image.ops import DecodeError
from cachekit.image.recipes import load_pipeline
from cachekit.tools.synthetic import synthetic_image

EOI = b"\xff\xd9"


def _photo(h=240, w=320, seed=0) -> np.ndarray:
    return synthetic_image(np.random.default_rng(seed), h, w)


def _pil_jpeg(progressive: bool, **kwargs) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_photo()).save(buf, "JPEG", quality=90, progressive=progressive, **kwargs)
    return buf.getvalue()


def _cut(data: bytes, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)] + EOI


PIPELINE = load_pipeline("classification-224")


def test_a_progressive_jpeg_cut_in_half_with_an_end_marker_is_refused():
    data = _pil_jpeg(progressive=True)
    cut = _cut(data, 0.5)
    assert cv2.imdecode(np.frombuffer(cut, np.uint8), cv2.IMREAD_COLOR) is not None  # "fine", partly grey
    assert "last scans are missing" in structure_problem(cut)
    with pytest.raises(DecodeError, match="truncated"):
        decode_input(cut, PIPELINE)
    assert structure_problem(data) is None
    decode_input(data, PIPELINE)


@pytest.mark.parametrize("progressive", [True, False], ids=["progressive", "baseline"])
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9, 0.995])
def test_a_jpeg_cut_anywhere_in_its_scans_is_refused(progressive, fraction):
    """The file's structure or the decoder's own report: either says the data ran out."""
    with pytest.raises(DecodeError, match="truncated"):
        decode_input(_cut(_pil_jpeg(progressive), fraction), PIPELINE)


def test_restart_markers_tell_a_cut_scan_from_the_structure_alone():
    data = cv2.imencode(".jpg", _photo()[..., ::-1], [cv2.IMWRITE_JPEG_RST_INTERVAL, 4])[1].tobytes()
    assert structure_problem(data) is None
    assert "restart marker" in structure_problem(_cut(data, 0.5))


def test_harmless_oddities_are_not_skips():
    """Junk bytes before the end marker (libjpeg: "extraneous bytes"), an EXIF thumbnail, optimised
    and subsampled encodings all decode whole."""
    exif = Image.Exif()
    exif[0x0112] = 1
    for data in (
        _pil_jpeg(progressive=False)[:-2] + b"\x00\x00\x00" + EOI,
        _pil_jpeg(progressive=True, exif=exif, optimize=True),
        _pil_jpeg(progressive=True, subsampling=0),
        _pil_jpeg(progressive=False, subsampling=2),
        cv2.imencode(".jpg", _photo()[..., ::-1], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes(),
    ):
        assert structure_problem(data) is None
        assert decode_input(data, PIPELINE).shape == (240, 320, 3)


def test_what_else_is_printed_while_the_decoder_is_heard_is_passed_on(capfd):
    cut = _cut(_pil_jpeg(progressive=False), 0.5)
    with decoder_messages() as said:
        os.write(2, b"another thread's complaint\n")
        cv2.imdecode(np.frombuffer(cut, np.uint8), cv2.IMREAD_COLOR)
    assert "premature end" in said().lower() and missing_data(said())
    err = capfd.readouterr().err
    assert "another thread's complaint" in err and "premature end" not in err.lower()
    with decoder_messages() as said:
        cv2.imdecode(np.frombuffer(_pil_jpeg(progressive=False), np.uint8), cv2.IMREAD_COLOR)
    assert said() == "" and missing_data(said()) is None


def test_a_build_skips_cut_jpegs_with_their_reason(tmp_path):
    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    (raw / "whole.jpg").write_bytes(_pil_jpeg(progressive=True))
    (raw / "half-progressive.jpg").write_bytes(_cut(_pil_jpeg(progressive=True), 0.5))
    (raw / "half-baseline.jpg").write_bytes(_cut(_pil_jpeg(progressive=False), 0.5))
    build(tmp_path / "raw", tmp_path / "c", BuildConfig(size=32, workers=1, progress=False))
    reasons = {s.path: s.reason for s in read_manifest(tmp_path / "c").skipped}
    assert set(reasons) == {"a/half-progressive.jpg", "a/half-baseline.jpg"}
    assert all("truncated" in r for r in reasons.values())
    assert len(CachedDataset(tmp_path / "c")) == 1


def test_without_a_stderr_to_borrow_the_structure_still_decides(monkeypatch):
    from cachekit.build import jpegcheck

    def no_sink():
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(jpegcheck, "_sink", no_sink)
    assert decode_input(_pil_jpeg(progressive=False), PIPELINE).shape == (240, 320, 3)
    with pytest.raises(DecodeError, match="last scans are missing"):
        decode_input(_cut(_pil_jpeg(progressive=True), 0.5), PIPELINE)


@pytest.mark.parametrize("progressive", [True, False], ids=["progressive", "baseline"])
@pytest.mark.parametrize("fraction", [0.3, 0.7, 0.999])
def test_a_jpeg_cut_without_an_end_marker_is_named_for_it(progressive, fraction):
    """Cut and left as cut (no marker appended): the missing end-of-image marker itself is the reason."""
    data = _pil_jpeg(progressive)
    cut = data[: int(len(data) * fraction)]
    assert not cut.endswith(EOI)
    with pytest.raises(DecodeError, match="no end-of-image marker"):
        decode_input(cut, PIPELINE)
    decode_input(data, PIPELINE)  # the whole file decodes
