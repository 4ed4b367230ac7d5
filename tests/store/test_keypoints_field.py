"""The keypoints field kind: stored per object beside its box, K in the manifest, read back as
float32 ``[N, K, 3]`` in the boxes' pixels. A shard whose points were tampered with (checksums
recomputed: a NaN, a visibility of 7, more objects than boxes) is a CacheError on every read and is
named by verify; a manifest whose K or whose boxes field does not fit is refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from manifests import listed_manifest, tampered_copy

from cachekit import BuildConfig, CachedDataset, CacheError, build, make_loader, verify
from cachekit.store.fields import FIELD_KINDS, FieldSpec
from cachekit.store.fields.keypoints import flip_pairs

H, W, K = 40, 72, 5
QUIET = {
    "workers": 1,
    "progress": False,
    "pipeline": "none",
    "strict": True,
    "order": "sorted",
    "shard_size": 4,
}


def _samples(n=8):
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        objects = i % 3  # 0, 1 or 2 objects
        boxes = np.array([[2 + 30 * o, 3, 25 + 30 * o, 35] for o in range(objects)], np.float32).reshape(
            -1, 4
        )
        points = np.zeros((objects, K, 3), np.float32)
        for o in range(objects):
            points[o, :, 0] = rng.uniform(boxes[o, 0], boxes[o, 2], K)
            points[o, :, 1] = rng.uniform(boxes[o, 1], boxes[o, 3], K)
            points[o, :, 2] = rng.integers(0, 3, K)
        image = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
        out.append((image, {"boxes": boxes, "classes": np.arange(objects), "keypoints": points}))
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("kpfield")
    build(_samples(), root / "c", BuildConfig(**QUIET), classes=2)
    return root / "c"


def test_points_read_back_as_stored_with_k_in_the_manifest(cache):
    ds = CachedDataset(cache)
    assert ds.manifest.sample.fields["keypoints"] == FieldSpec("keypoints", {"boxes": "boxes", "k": K})
    samples = _samples()
    for i in range(len(ds)):
        target = ds[i][1]
        want = samples[i][1]
        assert target["keypoints"].dtype == torch.float32
        assert target["keypoints"].shape == (len(want["boxes"]), K, 3)
        np.testing.assert_allclose(target["keypoints"].numpy(), want["keypoints"], atol=1e-5)
        np.testing.assert_allclose(target["boxes"].numpy(), want["boxes"])
    batch = next(iter(make_loader(cache, 8, shuffle=False, pad=True)))
    for i, t in enumerate(batch[1]):
        np.testing.assert_allclose(t["keypoints"].numpy(), samples[i][1]["keypoints"], atol=1e-5)


def _tampered(cache, tmp_path, change):
    """A copy of ``cache`` whose first shard's columns went through ``change``, checksums recomputed."""
    return tampered_copy(cache, tmp_path / "c", change)


def _nan(c):
    c["keypoints__points"][-1, 2, 0] = float("nan")


def _visibility(c):
    c["keypoints__points"][-1, 1, 2] = 7.0


def _misaligned(c):  # the last sample's objects: one more point block than boxes
    c["keypoints__points"] = torch.cat([c["keypoints__points"], c["keypoints__points"][-1:]])
    c["keypoints__offsets"][-1] += 1


def _outside(c):  # finite, but far past the image's right edge: pixels where none can be
    c["keypoints__points"][-1, 0, 0] = 1e6


def _above(c):  # a few pixels above the image: past the pixel of slack
    c["keypoints__points"][-1, 1, 1] = -3.0


CHANGES = {
    "nan": (_nan, "not finite"),
    "outside its image": (_outside, "outside its"),
    "above its image": (_above, "outside its"),
    "visibility 7": (_visibility, "visibility of 7"),
    "more objects than boxes": (_misaligned, "do not match the boxes"),
}


@pytest.mark.parametrize("case", list(CHANGES))
def test_a_tampered_shard_is_refused_by_every_read_and_named_by_verify(cache, tmp_path, case):
    change, words = CHANGES[case]
    bad = _tampered(cache, tmp_path, change)
    report = verify(bad)
    assert not report.ok and len(report.problems) == 1
    assert words in report.problems[0].problem
    with pytest.raises(CacheError, match=words):
        CachedDataset(bad)[0]  # sample 0 is fine: its shard is checked whole
    with pytest.raises(CacheError, match=words):
        next(iter(make_loader(bad, 2, shuffle=False, pad=True)))
    ds = CachedDataset(bad)
    assert ds[int(ds.shard_offsets[1])][1]["keypoints"].shape[1:] == (K, 3)  # the next shard reads


def test_points_within_a_pixel_of_their_image_are_read(cache, tmp_path):
    """The readers' and verify's bound is the boxes' (a pixel past each edge, x to the width, y to the
    height): points on it read back as stored."""

    def edges(c):
        c["keypoints__points"][-1, 0, :2] = torch.tensor([W + 0.9, H + 0.9])
        c["keypoints__points"][-1, 1, :2] = torch.tensor([-0.9, -0.9])

    copy = _tampered(cache, tmp_path, edges)
    assert verify(copy).ok
    ds = CachedDataset(copy)
    found = np.concatenate([ds[i][1]["keypoints"].numpy() for i in range(int(ds.shard_offsets[1]))])
    np.testing.assert_allclose(found[-1, :2, :2], [[W + 0.9, H + 0.9], [-0.9, -0.9]], rtol=1e-6)
    for _batch in make_loader(copy, 4, shuffle=False, pad=True):
        pass


def test_a_manifest_whose_keypoints_do_not_fit_is_refused(cache, tmp_path):
    for change, words in (
        (lambda f: f["keypoints"].update(k=K + 1), "manifest says"),
        (lambda f: f["keypoints"].update(boxes="nothing"), "is not a boxes field"),
        (lambda f: f["keypoints"].update(flip_idx=[0, 1]), "flip_idx"),
    ):
        copy = tmp_path / f"m{len(words)}{np.random.default_rng().integers(1 << 30)}"
        shutil.copytree(cache, copy)
        manifest = listed_manifest(copy)
        change(manifest["sample"]["fields"])
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(CacheError, match=words):
            CachedDataset(copy)[0]


def test_a_manifest_whose_flip_idx_is_no_mirror_is_refused_by_readers_and_verify(cache, tmp_path):
    """flip_idx [1, 2, 0, ...] lists each point once, but a flip would send every point of the
    cycle to the next index, and two flips would not give the sample back: the readers and
    ``verify`` (``cachekit verify``: exit 1, one line) refuse it, as a build does."""
    from click.testing import CliRunner

    from cachekit.cli import main

    copy = tmp_path / "cycle"
    shutil.copytree(cache, copy)
    manifest = listed_manifest(copy)
    manifest["sample"]["fields"]["keypoints"]["flip_idx"] = [1, 2, 0, *range(3, K)]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    said = "flip_idx: point 0 becomes 1 but 1 becomes 2: a mirror swaps points in pairs"
    with pytest.raises(CacheError, match=said):
        CachedDataset(copy)
    with pytest.raises(CacheError, match=said):
        make_loader(copy, 2, shuffle=False, pad=True)
    with pytest.raises(CacheError, match=said):
        verify(copy)
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 1 and said in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    # the pairs of the same list, each its own mirror, read
    manifest["sample"]["fields"]["keypoints"]["flip_idx"] = [1, 0, 2, 4, 3]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert CachedDataset(copy).manifest.sample.fields["keypoints"].params["flip_idx"] == [1, 0, 2, 4, 3]
    assert verify(copy).ok


def test_params_are_checked_and_flip_idx_pairs_left_and_right_names():
    kind = FIELD_KINDS["keypoints"]
    names = ["nose", "left_eye", "right_eye", "left_hip", "right_hip"]
    params = kind.check_params({"boxes": "boxes", "k": 5, "names": names, "skeleton": [[0, 1], [3, 4]]}, "f")
    assert params["skeleton"] == [[0, 1], [3, 4]]
    with pytest.raises(CacheError, match="skeleton"):
        kind.check_params({"boxes": "boxes", "k": 5, "skeleton": [[0, 5]]}, "f")
    with pytest.raises(CacheError, match="names"):
        kind.check_params({"boxes": "boxes", "k": 5, "names": names[:4]}, "f")
    with pytest.raises(CacheError, match=r"\.k"):
        kind.check_params({"boxes": "boxes", "k": 0}, "f")
    assert flip_pairs(names) == [0, 2, 1, 4, 3]
    assert flip_pairs(["a", "b"]) is None
    assert flip_pairs(["L_eye", "r_eye", "nose", "Right_Hip", "left_hip"]) == [1, 0, 2, 4, 3]
    # a name given twice (in any case) pairs with nothing: [2, 0, 0] would make two points one
    assert flip_pairs(["left_x", "right_x", "RIGHT_x"]) is None
    assert flip_pairs(["left_x", "right_x", "left_y", "right_y", "Left_Y"]) == [1, 0, 2, 3, 4]
    # the conventions pose sets name sides by: MPII's "r ankle", the side after the name, CamelCase,
    # Blender's ".L", the words alone; "lip" and "rip" are no pair (no separator after a one-letter side)
    names = ["nose", "r ankle", "l ankle", "eye_left", "eye_right", "leftEar", "rightEar", "Hand.L", "Hand.R"]
    names += ["left", "right", "lip", "rip", "hip-r", "hip-l"]
    assert flip_pairs(names) == [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 11, 12, 14, 13]
    assert flip_pairs(["lip", "rip", "l", "x"]) is None


def test_info_describes_the_keypoints_field(cache):
    from click.testing import CliRunner

    from cachekit.cli import main

    result = CliRunner().invoke(main, ["info", str(cache)])
    assert result.exit_code == 0, result.output
    assert f"keypoints: {K} keypoints per box (float32 [N, {K}, 3] x, y, visibility)" in result.output
