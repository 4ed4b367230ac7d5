"""``flip_idx=`` (``--flip-idx``) and ``keypoint_names=`` for sources that cannot state them
themselves (samples from code, Parquet, tars): checked against the samples' K, recorded in the
cache's keypoints field, and used by a horizontal flip on the threads and on the device path to
swap left and right points. Each point has a dot of its own colour: after the flip the pixel under
point ``i`` is the dot of the point ``flip_idx[i]`` it was before the mirror."""

from __future__ import annotations

import io
import json
import tarfile

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cachekit import BuildConfig, CachedDataset, CacheError, UsageError, build, make_loader
from cachekit.cli import main
from cachekit.transforms import CenterCrop, RandomHorizontalFlip

H, W, K, SAMPLES = 48, 64, 4, 4
FLIP = [1, 0, 3, 2]  # left_eye, right_eye, left_hand, right_hand
QUIET = {"workers": 1, "progress": False, "pipeline": "none", "strict": True, "order": "sorted"}
#: Every image mirrored, and its whole self kept (a fixed output size, which a cache of samples at
#: their own size needs).
FLIP_ALL = [RandomHorizontalFlip(p=1.0), CenterCrop((H, W))]
PATHS = {"threads": {"augment_on": "threads"}, "device": {"device": "cpu", "augment_on": "device"}}


def _colour(s: int, o: int, p: int) -> np.ndarray:
    """Sample ``s``, object ``o``, point ``p``'s own colour (no two alike, all far from black)."""
    n = (s * 2 + o) * K + p
    return np.array([60 + 6 * n, 250 - 5 * n, 100 + (37 * n) % 150], np.uint8)


def _samples():
    """Images of two objects, each of four points on a 8-pixel grid (object 0 left, 1 right), every
    point a 3x3 dot of its colour; object classes ``2s`` and ``2s + 1`` name the sample."""
    rng = np.random.default_rng(3)
    out = []
    for s in range(SAMPLES):
        image = np.zeros((H, W, 3), np.uint8)
        boxes, points = [], []
        for o in range(2):
            cols, rows = rng.choice(3, K) + 4 * o + 1, rng.choice(5, K, replace=False)
            xs, ys = 4 + 8 * cols, 4 + 8 * rows
            for p, (x, y) in enumerate(zip(xs, ys)):
                image[y - 1 : y + 2, x - 1 : x + 2] = _colour(s, o, p)
            boxes.append([xs.min() - 2, ys.min() - 2, xs.max() + 3, ys.max() + 3])
            points.append(np.stack([xs + 0.5, ys + 0.5, np.full(K, 2.0)], 1))
        target = {
            "boxes": np.array(boxes, np.float32),
            "classes": np.array([2 * s, 2 * s + 1]),
            "keypoints": np.array(points, np.float32),
        }
        out.append((image, target))
    return out


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """The samples as a map-style source given ``flip_idx`` as a list, and as an iterable given it as text."""
    root = tmp_path_factory.mktemp("flip")
    build(_samples(), root / "map", BuildConfig(**QUIET), classes=2 * SAMPLES, flip_idx=FLIP)
    build(iter(_samples()), root / "iter", BuildConfig(**QUIET), classes=2 * SAMPLES, flip_idx="1, 0,3,2")
    return root


def _uint8(images: torch.Tensor) -> np.ndarray:
    x = images.float()
    if x.max() <= 1.0 + 1e-6:
        x = x * 255
    return x.round().clamp(0, 255).to(torch.uint8).numpy()


@pytest.mark.parametrize("source", ["map", "iter"])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_flip_swaps_points_by_the_flip_idx_given_to_the_build(caches, source, path):
    ds = CachedDataset(caches / source)
    assert ds.manifest.sample.fields["keypoints"].params == {"boxes": "boxes", "k": K, "flip_idx": FLIP}
    original = {2 * s + o: t["keypoints"][o] for s, (_, t) in enumerate(_samples()) for o in range(2)}
    loader = make_loader(ds, 2, seed=1, augment=FLIP_ALL, threads=1, **PATHS[path])
    objects = 0
    for images, targets in loader:
        for image, t in zip(_uint8(images), targets):
            assert image.shape == (3, H, W)
            for c, points in zip(t["classes"].tolist(), t["keypoints"].numpy()):
                s, o = divmod(c, 2)
                was = original[c][FLIP]  # point i is the mirror of the point flip_idx[i] was
                np.testing.assert_allclose(points, np.stack([W - was[:, 0], was[:, 1], was[:, 2]], 1))
                for i, (x, y, _) in enumerate(points):
                    assert (image[:, int(y), int(x)] == _colour(s, o, FLIP[i])).all()
                objects += 1
    assert objects == 2 * SAMPLES


@pytest.mark.parametrize("given", [tuple(FLIP), np.array(FLIP), " 1 ,0, 3,2 ", [np.int64(v) for v in FLIP]])
def test_flip_idx_as_a_tuple_an_array_text_or_numpy_integers(tmp_path, given):
    build(_samples(), tmp_path / "c", BuildConfig(**QUIET), classes=2 * SAMPLES, flip_idx=given)
    flip = CachedDataset(tmp_path / "c").manifest.sample.fields["keypoints"].params["flip_idx"]
    assert flip == FLIP and all(type(v) is int for v in flip)


def test_keypoint_names_pair_left_and_right_and_a_flip_idx_given_beside_them_wins(tmp_path):
    names = ["left_eye", "right_eye", "left_hand", "right_hand"]
    build(_samples(), tmp_path / "n", BuildConfig(**QUIET), classes=2 * SAMPLES, keypoint_names=names)
    params = CachedDataset(tmp_path / "n").manifest.sample.fields["keypoints"].params
    assert params == {"boxes": "boxes", "k": K, "names": names, "flip_idx": FLIP}
    build(_samples(), tmp_path / "b", BuildConfig(**QUIET), classes=2 * SAMPLES, keypoint_names="a,b,c,d")
    params = CachedDataset(tmp_path / "b").manifest.sample.fields["keypoints"].params
    assert params == {"boxes": "boxes", "k": K, "names": ["a", "b", "c", "d"]}  # no pair: no flip_idx
    build(_samples(), tmp_path / "w", BuildConfig(**QUIET), classes=2 * SAMPLES, keypoint_names=names,
          flip_idx=np.arange(K))  # fmt: skip
    params = CachedDataset(tmp_path / "w").manifest.sample.fields["keypoints"].params
    assert params == {"boxes": "boxes", "k": K, "names": names, "flip_idx": [0, 1, 2, 3]}


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ([1, 0, 3], "flip_idx=[1, 0, 3]: it lists 3 points, the keypoints have 4"),
        (
            [0, 0, 3, 2],
            r"flip_idx=[0, 0, 3, 2]: it must list each point index from 0 to 3 once (0 is there twice)",
        ),
        (
            [1, 0, 3, 4],
            r"flip_idx=[1, 0, 3, 4]: it must list each point index from 0 to 3 once (4 is not one)",
        ),
        (
            "1,0,3,-2",
            r"flip_idx=[1, 0, 3, -2]: it must list each point index from 0 to 3 once (-2 is not one)",
        ),
        (
            [1, 2, 3, 0],
            "flip_idx=[1, 2, 3, 0]: point 0 becomes 1 but 1 becomes 2: a mirror swaps points in "
            "pairs (flip_idx[flip_idx[i]] == i)",
        ),  # fmt: skip
        ("1,0,x,2", "flip_idx='1,0,x,2': 'x' is not a point index (a whole number)"),
        ([1.0, 0, 3, 2], "flip_idx=[1.0, 0, 3, 2]: 1.0 is not a point index (a whole number)"),
        ([True, 0, 3, 2], "flip_idx=[True, 0, 3, 2]: True is not a point index (a whole number)"),
        (7, "flip_idx=7: give a list, or the values separated by commas"),
        (
            np.zeros((2, 2), int),
            "flip_idx=an array of shape [2, 2]: give a list, or the values separated by commas",
        ),
        ("1,0,3,\u0662", "flip_idx='1,0,3,\u0662': '\u0662' is not a point index (a whole number)"),
    ],
)
def test_a_flip_idx_that_cannot_be_right_is_one_line(tmp_path, given, why):
    with pytest.raises(UsageError) as caught:
        build(_samples(), tmp_path / "c", BuildConfig(**QUIET), classes=2 * SAMPLES, flip_idx=given)
    assert str(caught.value) == why
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_keypoint_options_for_a_source_without_keypoints_or_of_another_k_are_one_line(tmp_path):
    boxes_only = [(image, {k: v for k, v in t.items() if k != "keypoints"}) for image, t in _samples()]
    with pytest.raises(UsageError, match=r"^flip_idx= is for keypoints, and this source has none \(samples "):
        build(boxes_only, tmp_path / "a", BuildConfig(**QUIET), classes=2 * SAMPLES, flip_idx=FLIP)
    with pytest.raises(UsageError, match=r"^flip_idx= and keypoint_names= are for keypoints, and this"):
        build(boxes_only, tmp_path / "b", BuildConfig(**QUIET), classes=2 * SAMPLES, flip_idx=FLIP,
              keypoint_names="a,b,c,d")  # fmt: skip
    with pytest.raises(UsageError) as caught:
        build(_samples(), tmp_path / "c", BuildConfig(**QUIET), classes=2 * SAMPLES, keypoint_names="a,b,c")
    assert (
        str(caught.value) == "keypoint_names=['a', 'b', 'c']: give 4 names, one a point (the samples have 4)"
    )
    with pytest.raises(
        UsageError, match=r"^keypoint_names=\['a', 'b', 'a', 'c'\]: each point needs its own name$"
    ):
        build(_samples(), tmp_path / "d", BuildConfig(**QUIET), classes=2 * SAMPLES, keypoint_names="a,b,a,c")


def test_a_cache_whose_flip_idx_loses_a_point_is_refused_when_opened(caches, tmp_path):
    import shutil

    from manifests import listed_manifest

    shutil.copytree(caches / "map", tmp_path / "c")
    manifest = listed_manifest(tmp_path / "c")
    manifest["sample"]["fields"]["keypoints"]["flip_idx"] = [1, 1, 3, 2]
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match=r"keypoints\.flip_idx: it must list each point index from 0 to 3 once "
                       r"\(1 is there twice\)"):  # fmt: skip
        CachedDataset(tmp_path / "c")


def test_cli_flip_idx_for_a_tar_of_json_targets(tmp_path):
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        for i, (image, target) in enumerate(_samples()):
            json_target = {k: np.asarray(v).tolist() for k, v in target.items()}
            for name, data in (
                (f"{i:04d}.png", cv2.imencode(".png", image[:, :, ::-1])[1].tobytes()),
                (f"{i:04d}.json", json.dumps(json_target).encode()),
            ):
                member = tarfile.TarInfo(name)
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    common = [str(tmp_path / "t.tar"), "--pipeline", "none", "--workers", "1", "--quiet", "--classes"]
    names = tmp_path / "names.txt"
    names.write_text("".join(f"c{i}\n" for i in range(2 * SAMPLES)))
    ok = CliRunner().invoke(
        main, ["build", *common, str(names), "--out", str(tmp_path / "c"), "--flip-idx", "1,0,3,2"]
    )
    assert ok.exit_code == 0, ok.output
    params = CachedDataset(tmp_path / "c").manifest.sample.fields["keypoints"].params
    assert params == {"boxes": "boxes", "k": K, "flip_idx": FLIP}
    bad = CliRunner().invoke(
        main, ["build", *common, str(names), "--out", str(tmp_path / "d"), "--flip-idx", "0,1,2"]
    )
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        "error: flip_idx=[0, 1, 2]: it lists 3 points, the keypoints have 4"
    ]
    named = CliRunner().invoke(
        main, ["build", *common, str(names), "--out", str(tmp_path / "e"), "--keypoint-names", "l_a,r_a,b,c"]
    )
    assert named.exit_code == 0, named.output
    params = CachedDataset(tmp_path / "e").manifest.sample.fields["keypoints"].params
    assert params == {"boxes": "boxes", "k": K, "names": ["l_a", "r_a", "b", "c"], "flip_idx": [1, 0, 2, 3]}


def test_a_yolo_pose_folder_takes_flip_idx_and_names_over_its_data_yaml(tmp_path):
    """A data.yaml without flip_idx (or a wrong one) is completed from the build's options."""
    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "labels").mkdir()
    (raw / "data.yaml").write_text("names: [person]\nkpt_shape: [4, 3]\n")
    cv2.imwrite(str(raw / "images" / "0.png"), np.zeros((20, 30, 3), np.uint8))
    (raw / "labels" / "0.txt").write_text("0 0.5 0.5 0.8 0.8 " + " ".join(["0.5 0.5 2"] * K) + "\n")
    config = BuildConfig(annotations="yolo", **QUIET)
    build(raw, tmp_path / "a", config)
    assert CachedDataset(tmp_path / "a").manifest.sample.fields["keypoints"].params == {
        "boxes": "boxes",
        "k": K,
    }
    names = ["nose", "l_hand", "r_hand", "tail"]
    build(raw, tmp_path / "b", config, flip_idx="1,0,3,2")
    build(raw, tmp_path / "c", config, keypoint_names=names)
    assert CachedDataset(tmp_path / "b").manifest.sample.fields["keypoints"].params["flip_idx"] == FLIP
    assert CachedDataset(tmp_path / "c").manifest.sample.fields["keypoints"].params == {
        "boxes": "boxes", "k": K, "names": names, "flip_idx": [0, 2, 1, 3]
    }  # fmt: skip


def test_a_parquet_source_takes_flip_idx_and_a_flip_swaps_by_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, (image, target) in enumerate(_samples()):
        png = cv2.imencode(".png", image[:, :, ::-1])[1].tobytes()
        objects = {"bbox": target["boxes"].tolist(), "category": target["classes"].tolist(),
                   "keypoints": target["keypoints"].tolist()}  # fmt: skip
        rows.append({"image": {"bytes": png, "path": f"{i}.png"}, "objects": objects})
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "train-00000.parquet")
    build(str(tmp_path / "pq" / "*.parquet"), tmp_path / "c", BuildConfig(**QUIET), classes=2 * SAMPLES,
          flip_idx=FLIP)  # fmt: skip
    ds = CachedDataset(tmp_path / "c")
    assert ds.manifest.sample.fields["keypoints"].params == {"boxes": "boxes", "k": K, "flip_idx": FLIP}
    images, targets = next(iter(make_loader(ds, SAMPLES, shuffle=False, augment=FLIP_ALL, threads=1)))
    for image, t in zip(_uint8(images), targets):
        for c, points in zip(t["classes"].tolist(), t["keypoints"].numpy()):
            for i, (x, y, _) in enumerate(points):
                assert (image[:, int(y), int(x)] == _colour(*divmod(c, 2), FLIP[i])).all()
