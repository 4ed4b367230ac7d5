"""``cachekit bench --augment``: every row crops and flips each sample, the way its kind of user
would, over a cache of variable-sized samples; the crops are torchvision's, checked pixel for pixel."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import BAD_FILES, GOOD_FILES, ONE_WORKER_ROW_LABELS
from PIL import Image

from cachekit import BuildConfig, CachedDataset, build
from cachekit.build.shardjob import decode_input, read_input
from cachekit.cli import main
from cachekit.errors import UsageError
from cachekit.tools.baselines import (
    OpenCVRandomResizedCropFlip,
    RawImageDataset,
    check_raw_inputs,
    rrc_params,
)
from cachekit.tools.bench import BenchConfig, run_bench
from cachekit.tools.benchrows import AUGMENT_HOW, augment_size, make_loader_row
from cachekit.tools.benchsamples import cache_pipeline
from cachekit.tools.benchsynthetic import bench_synthetic
from cachekit.tools.benchview import AUGMENTED_KINDS, bench_figure, format_table

SIDE = 24  # crop side of the augmented rows in these tests


@pytest.fixture(scope="module")
def ragged_cache(mixed_tree, tmp_path_factory):
    """The mixed tree as train-256 does it (shorter side to a size, no crop), at a small size."""
    out = tmp_path_factory.mktemp("benchaug") / "cache"
    build(mixed_tree, out, BuildConfig(pipeline="train-256", size=40, workers=1, progress=False))
    return out


@pytest.fixture(scope="module")
def augmented(mixed_tree, ragged_cache):
    """Both raw backends and the cache, in-process and one worker, augmented to SIDE x SIDE."""
    config = BenchConfig(batch_size=4, workers=(0, 1), epochs=2, cold=False, augment=True, augment_size=SIDE)
    return run_bench(mixed_tree, [ragged_cache], config)


def test_every_row_crops_the_same_samples_to_one_size(augmented, ragged_cache):
    assert CachedDataset(ragged_cache).ragged  # a cache bench refuses without --augment
    skipped = {s["path"]: s["reason"] for s in augmented["raw"]["skipped"]}
    for path, word in BAD_FILES.items():
        assert word in skipped[path]
    assert augmented["samples"] == len(GOOD_FILES) and augmented["aligned_by"] == "source path"
    rows = [(r["loader"], r["workers"]) for r in augmented["rows"]]
    assert rows == [
        ("raw-pil", 0), ("raw-pil", 1), ("raw-opencv", 0), ("raw-opencv", 1),
        ("cache-pt", 0), ("cache-pt", 1), ("cache-pt", "make_loader"),
    ]  # fmt: skip
    for r in augmented["rows"]:
        assert [e["samples"] for e in r["epochs"]] == [len(GOOD_FILES)] * 2, r["loader"]
        assert [e["bytes"] for e in r["epochs"]] == [len(GOOD_FILES) * 3 * SIDE * SIDE] * 2, r["loader"]
        assert r["samples_per_s"] > 0 and r["speedup"] > 0
    assert augmented["config"]["augment"] is True
    assert augmented["augment"] == {
        "size": [SIDE, SIDE],
        "scale": [0.08, 1.0],
        "ratio": [3 / 4, 4 / 3],
        "flip_p": 0.5,
        "how": AUGMENT_HOW,
    }
    assert not any("memcpy" in key for key in augmented["ratios"])  # a resize bounds these rows
    assert augmented["caches"][0]["pipeline"] == "train-256" and augmented["caches"][0]["shape"][1] is None
    json.dumps(augmented)


def test_a_variable_sized_cache_without_augment_says_to_augment(mixed_tree, ragged_cache):
    with pytest.raises(UsageError, match="compare it with --augment"):
        run_bench(mixed_tree, [ragged_cache], BenchConfig(batch_size=4, workers=(0,), epochs=1, cold=False))


def test_the_make_loader_row_yields_random_crops_of_the_size(ragged_cache):
    ds = CachedDataset(ragged_cache)
    loader, extra = make_loader_row(ragged_cache, 4, 0, (SIDE, SIDE + 8))()
    assert "threads" in extra["mode"] or "in-process" in extra["mode"]
    epochs = []
    for _ in range(2):
        images, labels = [], []
        for batch_images, batch_labels in loader:
            images.append(batch_images)
            labels.append(batch_labels)
        epochs.append((torch.cat(images), torch.cat(labels)))
    for images, labels in epochs:
        assert images.shape == (len(ds), 3, SIDE, SIDE + 8) and images.dtype == torch.uint8
        assert sorted(labels.tolist()) == sorted(ds.read_samples(list(range(len(ds))))[1].tolist())
        assert images.float().std() > 10  # pictures, not zeros
    # each pass is a new order with new crops: no sample's output repeats
    first = {bytes(img.numpy()) for img in epochs[0][0]}
    assert not first & {bytes(img.numpy()) for img in epochs[1][0]}
    ds.close()


def test_rrc_params_are_torchvisions():
    rng = random.Random(0)
    for height, width in [(40, 60), (256, 341), (7, 5)]:
        for _ in range(300):
            top, left, h, w = rrc_params(height, width, rng=rng)
            assert 0 <= top <= height - h and 0 <= left <= width - w and h > 0 and w > 0
    # a box that fits is drawn inside the scale and aspect bounds (up to rounding to whole pixels)
    for _ in range(300):
        top, left, h, w = rrc_params(300, 400, rng=rng)
        if (h, w) != (300, 400):
            assert 0.07 <= h * w / (300 * 400) <= 1.0 and 0.74 <= w / h <= 1.35
    # no box fits a 10x1000 strip: torchvision's central crop of the widest allowed aspect
    assert rrc_params(10, 1000, rng=rng) == (0, 493, 10, 13)
    assert rrc_params(1000, 10, rng=rng) == (493, 0, 13, 10)  # narrowest: w / (3/4)
    assert rrc_params(10, 12, scale=(2.0, 3.0), rng=rng) == (0, 0, 10, 12)  # within the ratio: whole


@pytest.mark.parametrize("backend", ["pil", "opencv"])
def test_raw_rows_crop_the_decoded_file_as_their_users_would(mixed_tree, ragged_cache, backend):
    inputs = check_raw_inputs(mixed_tree, cache_pipeline(CachedDataset(ragged_cache)), pil=True)
    ds = RawImageDataset(inputs, backend=backend, augment=(SIDE, SIDE + 4))
    flips = 0
    for i, rel in enumerate(inputs.paths):
        if rel in {p for p, _ in inputs.refused}:
            continue
        random.seed(i)
        image, label = ds[i]
        assert image.shape == (3, SIDE, SIDE + 4) and label == int(inputs.labels[i])
        random.seed(i)
        path = Path(mixed_tree) / rel
        if backend == "pil":  # torchvision: default_loader, crop, bilinear resize, flip
            with Image.open(path) as opened:
                full = opened.convert("RGB")
            top, left, h, w = rrc_params(full.height, full.width)
            out = full.crop((left, top, left + w, top + h)).resize((SIDE + 4, SIDE), Image.BILINEAR)
            flip = random.random() < 0.5
            expected = np.asarray(out.transpose(Image.FLIP_LEFT_RIGHT) if flip else out)
        else:  # a build's decode (EXIF, 16-bit, alpha handled), the same box, cv2.resize, flip
            full = decode_input(read_input(path), inputs.pipeline)
            top, left, h, w = rrc_params(*full.shape[:2])
            out = cv2.resize(
                full[top : top + h, left : left + w], (SIDE + 4, SIDE), interpolation=cv2.INTER_LINEAR
            )
            flip = random.random() < 0.5
            expected = out[:, ::-1] if flip else out
        flips += flip
        assert np.array_equal(image.numpy().transpose(1, 2, 0), expected), rel
    assert 0 < flips < len(inputs.paths)


def test_the_cache_rows_transform_crops_a_chw_tensor():
    image = torch.arange(3 * 30 * 50, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(3, 30, 50)
    transform = OpenCVRandomResizedCropFlip(16)
    random.seed(3)
    out = transform(image)
    random.seed(3)
    top, left, h, w = rrc_params(30, 50)
    crop = cv2.resize(image.numpy().transpose(1, 2, 0)[top : top + h, left : left + w], (16, 16))
    expected = crop[:, ::-1] if random.random() < 0.5 else crop
    assert out.shape == (3, 16, 16) and out.is_contiguous()
    assert np.array_equal(out.numpy().transpose(1, 2, 0), expected)
    gray = OpenCVRandomResizedCropFlip((8, 12))(image[:1])
    assert gray.shape == (1, 8, 12)


def test_the_crop_size_follows_the_caches():
    def cache(shape):
        return SimpleNamespace(ragged=shape[1] is None, sample_shape=shape)

    aug = BenchConfig(augment=True)
    assert augment_size(BenchConfig(), ["a"], [cache((3, 32, 32))]) is None
    assert augment_size(aug, ["a", "b"], [cache((3, None, None)), cache((3, 32, 48))]) == (32, 48)
    assert augment_size(aug, ["a"], [cache((3, None, None))]) == (224, 224)
    assert augment_size(BenchConfig(augment=True, augment_size=64), ["a"], [cache((3, 32, 32))]) == (64, 64)
    with pytest.raises(
        UsageError, match=r"different sizes \(32x32 \(a\), 64x64 \(b\)\): give --augment-size"
    ):
        augment_size(aug, ["a", "b"], [cache((3, 32, 32)), cache((3, 64, 64))])


@pytest.mark.filterwarnings("error")  # a layout that collapses warns
def test_the_chart_and_table_say_the_rows_are_augmented(augmented, tmp_path):
    from test_bench import _assert_nothing_clipped

    fig = bench_figure(augmented)
    title = fig.get_suptitle()
    assert title.startswith(
        f"cachekit bench, augmented: every row does RandomResizedCrop({SIDE}) + horizontal flip"
    )
    assert "from train-256 caches" in title and "1x = the best raw loader" in title
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:-1] == ONE_WORKER_ROW_LABELS
    assert labels[-1].startswith("pt cache, make_loader (in-process") and "augment" not in labels[-1]
    assert not any(":" in label or ";" in label for label in labels)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == list(AUGMENTED_KINDS.values())
    _assert_nothing_clipped(fig)
    table = format_table(augmented)
    assert (
        table.splitlines()[0]
        == f"augmented rows: every row does RandomResizedCrop({SIDE}) + horizontal flip per sample"
    )
    assert "(pt, train-256, variable size, 8 samples)" in table and AUGMENT_HOW["make_loader"] in table


def test_cli_augment_flags(mixed_tree, ragged_cache, tmp_path):
    def cli(*args):
        result = CliRunner().invoke(main, ["bench", *map(str, args)])
        return result.exit_code, result.stdout, result.stderr

    code, _, err = cli(mixed_tree, ragged_cache, "--augment-size", "64")
    assert code == 2 and err.strip() == "error: --augment-size needs --augment"
    code, _, err = cli("--synthetic", 4, "--workdir", tmp_path / "w", "--augment", "--augment-size", "0")
    assert code == 2 and "--augment-size must be between 1 and 4096" in err and not (tmp_path / "w").exists()
    code, out, err = cli(
        mixed_tree, ragged_cache, "--augment", "--raw-backends", "opencv", "--workers", "0", "--epochs", "1",
        "--batch-size", "4", "--warm-only", "--quiet", "--json", tmp_path / "r.json",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("augmented rows: every row does RandomResizedCrop(224) + horizontal flip")
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["augment"]["size"] == [224, 224] and result["samples"] == len(GOOD_FILES)


def test_synthetic_augment_builds_train256_caches(tmp_path):
    config = BenchConfig(batch_size=2, workers=(0,), epochs=1, cold=False, augment=True, augment_size=SIDE)
    result = bench_synthetic(3, config, workdir=tmp_path, formats=("pt",))
    assert [b["pipeline"] for b in result["builds"]] == ["train-256"]
    assert result["caches"][0]["pipeline"] == "train-256" and result["caches"][0]["shape"][1:] == [None, None]
    assert (tmp_path / "train256-pt" / "manifest.json").is_file()
    assert result["samples"] == 3 and {r["bytes_per_sample"] for r in result["rows"]} == {3 * SIDE * SIDE}


def test_cli_augment_spec_runs_any_transform_in_the_make_loader_rows(mixed_tree, ragged_cache, tmp_path):
    def cli(*args):
        result = CliRunner().invoke(main, ["bench", *map(str, args)])
        return result.exit_code, result.stdout, result.stderr

    spec = "RandomResizedCrop(40, scale=(0.5, 1.0)), RandomHorizontalFlip(), ColorJitter(0.3, 0.3)"
    code, out, err = cli(
        mixed_tree, ragged_cache, "--raw-backends", "opencv", "--workers", "0", "--epochs", "1", "--batch-size", "4",
        "--warm-only", "--quiet", "--json", tmp_path / "r.json", "--augment", spec,
    )  # fmt: skip
    assert code == 0, err
    assert "only the make_loader rows run it" in err and out.startswith(
        "augmented rows: make_loader(augment=["
    )
    result = json.loads((tmp_path / "r.json").read_text())
    assert [r["workers"] for r in result["rows"]] == ["make_loader"]
    assert result["augment"]["size"] == [40, 40] and "ColorJitter(brightness=0.3" in result["augment"]["spec"]
    for hostile, why in (
        ("__import__('os').system('true')", "not a transform's name"),
        ("Nope()", "unknown"),
    ):
        code, _, err = cli(mixed_tree, ragged_cache, "--augment", hostile)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err
    code, _, err = cli("--augment", mixed_tree, ragged_cache)  # a path taken for the SPEC
    assert code == 2 and "put the paths before --augment" in err
