"""What a user's op returns that the loader cannot use is refused in one line saying what it is and
what to return instead: a ``BatchOp`` batch with no data (the meta device) or not dense (sparse), a
``MatrixOp`` map that scales the image past any output it could show (said as a scale, with the sizes
it gives, never as a shift of 0 pixels), one that shifts it so, or one that squashes it flat."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.errors import UsageError
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import BatchOp, MatrixOp, Resize

THREADS = {"augment_on": "threads", "threads": 2}
DEVICE = {"device": "cpu", "augment_on": "device"}
BASE = [Resize((64, 64))]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refusals")
    raw = make_object_dataset(tmp / "raw", 8, size=(48, 64), classes=3, seed=2)
    config = BuildConfig(
        annotations="yolo", workers=1, progress=False, pipeline="classification-224", size=64
    )
    build(raw, tmp / "cache", config)
    return CachedDataset(tmp / "cache")


def _refusal(ds, augment, **path) -> str:
    with pytest.raises(UsageError) as caught:
        for _ in make_loader(ds, 4, seed=3, augment=augment, shuffle=False, **path):
            pass
    text = str(caught.value)
    assert "\n" not in text and len(text) < 400
    return text


def _read(ds, augment, **path) -> list[torch.Tensor]:
    return [x.clone() for x, _ in make_loader(ds, 4, seed=3, augment=augment, shuffle=False, **path)]


# -- a BatchOp's batch with no data, or not dense ------------------------------------------------------


def on_meta(images, generator):
    return torch.empty_like(images, device="meta")


def sparse(images, generator):
    return images.to_sparse()


@pytest.mark.parametrize("path", [THREADS, DEVICE], ids=["threads", "device"])
@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (on_meta, r"BatchOp\(test_user_ops_refusals.on_meta\) returned a tensor on the meta device \(shapes, no "
         r"data\) for the batch starting at sample \d+, not a dense uint8 batch on cpu, where it was given: "
         r"return its values on cpu$"),
        (sparse, r"BatchOp\(test_user_ops_refusals.sparse\) returned a sparse_coo tensor on cpu for the batch "
         r"starting at sample \d+, not a dense uint8 batch on cpu, where it was given: return it dense "
         r"\(\.to_dense\(\)\)$"),
    ],
    ids=["meta", "sparse"],
)  # fmt: skip
def test_a_batch_op_returning_a_batch_with_no_plain_data_is_one_line(cache, path, fn, said):
    text = _refusal(cache, [*BASE, BatchOp(fn)], **path)
    assert re.fullmatch(r"augment: " + said, text), text


def test_a_batch_op_returning_its_batch_dense_again_reads(cache):
    def dense_again(images, generator):
        return images.to_sparse().to_dense()

    plain = _read(cache, BASE, **THREADS)
    assert all(
        torch.equal(a, b) for a, b in zip(plain, _read(cache, [*BASE, BatchOp(dense_again)], **THREADS))
    )


# -- a MatrixOp's map past any output it could show ---------------------------------------------------


def scaled_by(factor: float, shift: float = 0.0):
    def fn(height, width, rng):
        return np.array([[factor, 0.0, shift], [0.0, factor, 0.0], [0.0, 0.0, 1.0]])

    fn.__qualname__ = fn.__name__ = f"scale_{factor:g}"
    return fn


def squash(height, width, rng):
    return np.diag([1e30, 1.0, 1.0])  # one axis 1e30 times the other: a line


def far(height, width, rng):
    return np.array([[1.0, 0.0, 0.0], [0.0, 1.0, -1e13], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize(
    ("op", "path", "said"),
    [
        (MatrixOp(scaled_by(1e30)), THREADS, r"enlarges the image 1e\+30 times \(its 64 x 64 output shows "
         r"6\.4e-29 x 6\.4e-29 pixels\), past the 1e\+12 times a map may scale by: keep its scale near the "
         r"output's size over the image's$"),
        (MatrixOp(scaled_by(1e30), size=(32, 48)), DEVICE, r"enlarges the image 1e\+30 times \(its 32 x 48 "
         r"output shows 3\.2e-29 x 4\.8e-29 pixels\)"),
        (MatrixOp(scaled_by(1e-30)), THREADS, r"shrinks the image 1e\+30 times \(its 64 x 64 pixels become "
         r"6\.4e-29 x 6\.4e-29\), past the 1e\+12 times"),
        (MatrixOp(scaled_by(1e-13)), DEVICE, r"shrinks the image 1e\+13 times \(its 64 x 64 pixels become "
         r"6\.4e-12 x 6\.4e-12\)"),
        (MatrixOp(scaled_by(1e30, shift=1e30)), THREADS, r"enlarges the image 1e\+30 times"),
        (MatrixOp(far), THREADS, r"returned a matrix for sample \d+ that moves the image by 1e\+13 pixels, past "
         r"any output it could show: keep its translation near the image's size$"),
        (MatrixOp(squash), THREADS, r"squash\) returned a singular matrix for sample \d+ \(it squashes the image "
         r"onto a line or a point\): return an invertible map$"),
    ],
    ids=["1e30", "1e30-sized", "1e-30", "1e-13", "1e30-shifted", "far", "squash"],
)  # fmt: skip
def test_a_matrix_past_any_output_says_what_it_does(cache, op, path, said):
    text = _refusal(cache, [*BASE, op], **path)
    assert re.search(said, text), text
    assert "0 pixels" not in text


def test_a_large_but_finite_scale_reads(cache):
    """1e11 is within the scale a map may have: read, each output one magnified pixel, one colour."""
    got = _read(cache, [*BASE, MatrixOp(scaled_by(1e11))], **THREADS)
    assert len(got) == 2 and all(x.shape == (4, 3, 64, 64) for x in got)
    assert all(torch.equal(x, x[:, :, :1, :1].expand_as(x)) for x in got)
