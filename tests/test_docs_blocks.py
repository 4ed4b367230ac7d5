"""Every ```python and ```bash block of README.md and docs/*.md is run by a test, or listed here with
why it is not: a new block fails ``test_every_block_is_run_or_listed`` until it is one or the other.

The blocks the other tests do not run are run here, as written but for the substitutions that make
them run on this machine (a test cache for the user's paths, the CPU for ``"cuda"``, small batches).
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import cv2
import pytest
import torch
from click.testing import CliRunner

from cachekit import BuildConfig, CachedDataset, build
from cachekit.cli import main
from cachekit.tools.synthetic_objects import make_object_dataset

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^[ \t]*```(python|bash)[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
_HERE = "tests/test_docs_blocks.py"

#: (page, a line unique to the block) -> the test that runs it.
RUN = {
    ("README.md", "cachekit build raw/train --out cache/train"):
        "tests/test_readme.py::test_the_first_screen_builds_then_trains_and_evaluates",
    ("README.md", "    CachedDataset(\"cache/train\"),"):
        "tests/test_readme.py::test_the_first_screen_builds_then_trains_and_evaluates",
    ("README.md", "cachekit build coco/ --out cache/det"):
        f"{_HERE}::test_the_readme_annotation_commands_build_what_they_say",
    ("README.md", 'ds = CachedDataset("cache/det")'):
        "tests/test_readme.py::test_the_detection_example_reads_boxes_moved_with_their_letterbox",
    ("README.md", "RandAugment(num_ops=2, magnitude=9),"):
        "tests/test_readme.py::test_the_deit_recipe_runs_and_gives_soft_labels",
    ("README.md", "epochs, close_mosaic = 100, 10"):
        "tests/test_readme.py::test_the_yolo_recipe_runs_and_closes_mosaic",
    ("README.md", "cachekit bench --synthetic 2000"):
        f"{_HERE}::test_the_readme_bench_line_compares_raw_files_with_caches",
    ("README.md", "cachekit preview cache/det --augment"):
        f"{_HERE}::test_the_readme_annotation_commands_build_what_they_say",
    ("README.md", "class Pets:"):
        "tests/test_readme_sources.py::test_a_torchvision_style_dataset_builds_as_the_readme_says",
    ("README.md", 'cachekit.build("data/train-*.parquet"'):
        "tests/test_readme_sources.py::test_parquet_and_tar_snippets_build_as_the_readme_says",
    ("docs/TRAINING.md", 'ds = CachedDataset("cache/")'):
        "tests/test_readme.py::test_the_train_val_loop_of_feeding_gpus_reshuffles_every_epoch",
    ("docs/TRAINING.md", '"coco-cache/",'):
        f"{_HERE}::test_the_geometric_example_reads_mosaics_and_ssd_crops",
    ("docs/TRAINING.md", "cachekit.trace_handler(loader"):
        "tests/feed/test_stages.py::test_the_documented_profiled_loop_runs_as_written",
    ("docs/TRAINING.md", "MixUpOrCutMix(mixup_alpha=0.8"):
        f"{_HERE}::test_the_randaugment_example_gives_soft_labels",
    ("docs/TRAINING.md", "def speckle(image, rng):"):
        "tests/augment/test_user_ops.py::test_the_documented_example_runs_as_written",
    ("docs/TRAINING.md", "mixed = mix([photos, scans]"):
        "tests/test_readme.py::test_the_mixing_example_draws_both_caches_with_their_classes_apart",
    ("docs/TRAINING.md", "torchrun --nproc_per_node 2 examples/train_ddp.py"):
        "tests/test_examples.py::test_train_ddp_learns_on_either_recipe_in_one_process_and_under_torchrun",
    ("docs/TRAINING.md", "for epoch in range(300):"):
        "tests/test_readme.py::test_the_deit_recipe_runs_and_gives_soft_labels",
    ("docs/TRAINING.md", "epochs, close_mosaic = 100, 10"):
        "tests/test_readme.py::test_the_yolo_recipe_runs_and_closes_mosaic",
    ("docs/TRAINING.md", "class Classifier(L.LightningModule):"):
        "tests/trainers/test_docs_examples.py::test_the_lightning_example_trains_under_ddp_and_checkpoints",
    ("docs/TRAINING.md", "model, optimizer = accelerator.prepare(model, optimizer)  # not the loader"):
        "tests/trainers/test_docs_examples.py::test_the_accelerate_example_runs_in_two_processes",
    ("docs/SCALE.md", 'local_cache="/nvme/shards",'):
        f"{_HERE}::test_the_object_storage_example_reads_through_the_node_cache",
}  # fmt: skip

#: (page, a line unique to the block) -> why no test runs it.
NOT_RUN = {
    ("README.md", "pip install 'torch==2.13.0' '.[dev]'"):
        "installs the package; .ci/run runs these lines in a fresh venv",
    ("README.md", "docker run --rm --shm-size=8g"):
        "needs Docker; .ci/run runs the Dockerfile's install lines",
    ("README.md", "pip install 'torch==2.13.0' -e '.[dev]'"):
        "the development commands: the test suite, ruff, CI and mutation runs themselves",
    ("docs/SCALE.md", "cachekit build raw/ --out s3://bucket/cache"):
        "a sketch with elided options (...); tests/test_cli.py builds to and verifies on a local S3 server",
    ("docs/SCALE.md", "python benchmarks/run.py listing"):
        "a benchmark of minutes to hours; benchmarks/ has its own checks",
    ("docs/SCALE.md", "python benchmarks/run.py stream"):
        "a benchmark of minutes to hours; benchmarks/ has its own checks",
    ("docs/SCALE.md", "python benchmarks/run.py scale"):
        "a benchmark of minutes to hours; benchmarks/ has its own checks",
}  # fmt: skip


def _blocks() -> list[tuple[str, int, str, str]]:
    """Every python and bash block: (page relative to the repository, line, language, code)."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            found.append(
                (
                    page.relative_to(ROOT).as_posix(),
                    text.count("\n", 0, m.start()) + 1,
                    m.group(1),
                    m.group(2),
                )
            )
    return found


def _block(page: str, marker: str) -> str:
    (code,) = [code for p, _, _, code in _blocks() if p == page and marker in code]
    return code


def _substitute(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in code, f"the docs changed: {old!r} is no longer in their example"
        code = code.replace(old, new)
    return code


def _unaccounted(blocks, entries: dict) -> list[str]:
    """What is wrong with ``entries`` (RUN and NOT_RUN) for ``blocks``: a block no entry matches, one
    two entries match, an entry matching two blocks or none."""
    problems, seen = [], {}
    for page, line, language, code in blocks:
        keys = [key for key in entries if key[0] == page and key[1] in code]
        if not keys:
            problems.append(
                f"{page}:{line}: this ```{language} block is run by no test: run it (in {_HERE} or beside "
                "the code it shows) and add it to RUN, or add it to NOT_RUN with the reason"
            )
        elif len(keys) > 1:
            problems.append(f"{page}:{line}: matched by {keys}: give each a line of its own block")
        for key in keys:
            if key in seen:
                problems.append(f"{key} matches {seen[key]} and {page}:{line}: give it a line of one only")
            seen[key] = f"{page}:{line}"
    problems += [f"{key} matches no block" for key in entries if key not in seen]
    return problems


def test_every_block_is_run_or_listed():
    assert not set(RUN) & set(NOT_RUN)
    for test in RUN.values():  # each names a test that is there
        module, name = test.split("::")
        assert f"def {name}(" in (ROOT / module).read_text(encoding="utf-8"), test
    blocks = _blocks()
    assert {language for *_, language, _ in blocks} == {"python", "bash"} and len(blocks) >= 20
    assert _unaccounted(blocks, {**RUN, **NOT_RUN}) == []


def test_a_new_block_fails_until_it_is_run_or_listed():
    blocks = [*_blocks(), ("docs/TRAINING.md", 999, "python", "import cachekit\nnew_example()\n")]
    (problem,) = _unaccounted(blocks, {**RUN, **NOT_RUN})
    assert problem.startswith("docs/TRAINING.md:999: this ```python block is run by no test")
    listed = {**RUN, **NOT_RUN, ("docs/TRAINING.md", "new_example()"): "a sketch"}
    assert _unaccounted(blocks, listed) == []
    twice = [*blocks, ("docs/TRAINING.md", 1000, "bash", "new_example()\n")]
    assert _unaccounted(twice, listed) == [
        "('docs/TRAINING.md', 'new_example()') matches docs/TRAINING.md:999 and docs/TRAINING.md:1000: "
        "give it a line of one only"
    ]
    assert _unaccounted(_blocks(), listed) == ["('docs/TRAINING.md', 'new_example()') matches no block"]


@pytest.fixture(scope="module")
def detection_cache(tmp_path_factory) -> Path:
    raw = make_object_dataset(tmp_path_factory.mktemp("docs") / "raw", 8, size=(60, 80))
    out = raw.parent / "det"
    build(
        raw,
        out,
        BuildConfig(annotations="yolo", pipeline="letterbox-640", size=96, workers=1, progress=False),
    )
    return out


def test_the_geometric_example_reads_mosaics_and_ssd_crops(detection_cache):
    code = _substitute(
        _block("docs/TRAINING.md", '"coco-cache/",'),
        {'"coco-cache/",\n    16,': f"{str(detection_cache)!r},\n    4,", '"voc-cache/",\n    32,':
         f"{str(detection_cache)!r},\n    4,", "Mosaic(640)": "Mosaic(128)"},
    )  # fmt: skip
    scope: dict = {}
    exec(compile(code, "docs/TRAINING.md", "exec"), scope)
    images, targets = next(iter(scope["yolo"]))
    assert images.shape == (4, 3, 128, 128) and targets.dim() == 2 and targets.shape[1] == 6
    assert set(targets[:, 0].long().tolist()) <= {0, 1, 2, 3} and (targets[:, 2:] >= 0).all()
    images, targets = next(iter(scope["ssd"]))
    assert images.shape == (4, 3, 300, 300) and len(targets) == 4
    for t in targets:
        assert ((t["boxes"] >= 0) & (t["boxes"] <= 300)).all() and len(t["boxes"]) == len(t["classes"])


def test_the_randaugment_example_gives_soft_labels(mixed_tree, tmp_path):
    cache = tmp_path / "train"
    build(mixed_tree, cache, BuildConfig(pipeline="train-256", size=48, workers=1, progress=False))
    code = _substitute(
        _block("docs/TRAINING.md", "MixUpOrCutMix(mixup_alpha=0.8"),
        {'"cache/", 256': f"{str(cache)!r}, 4", 'device="cuda"': 'device="cpu"',
         "model(images)": "torch.zeros(len(images), soft_labels.shape[1])",
         "    loss = ": "    seen.append((images.shape, soft_labels)); loss = "},
    )  # fmt: skip
    scope: dict = {"seen": []}
    exec(compile(code, "docs/TRAINING.md", "exec"), scope)
    assert len(scope["seen"]) == len(scope["loader"]) > 1
    for shape, soft in scope["seen"]:
        assert tuple(shape[1:]) == (3, 224, 224) and soft.dtype == torch.float32
        assert torch.allclose(soft.sum(1), torch.ones(len(soft)), atol=1e-4)


def _object_tree(root: Path) -> Path:
    return make_object_dataset(root, 6, size=(60, 80))


def test_the_readme_annotation_commands_build_what_they_say(tmp_path, monkeypatch):
    """Each build line of "Detection and segmentation", in a folder laid out as it says, builds the
    fields it names; then the preview line draws the detection cache."""
    coco = _object_tree(tmp_path / "coco")
    (coco / "coco.json").rename(coco / "annotations.json")
    _object_tree(tmp_path / "yolo")
    objects = _object_tree(tmp_path / "objects")
    shutil.copytree(objects / "images", tmp_path / "voc" / "JPEGImages")  # VOC's segmentation layout
    shutil.copytree(objects / "masks" / "images", tmp_path / "voc" / "SegmentationClass")
    monkeypatch.chdir(tmp_path)
    commands = [
        shlex.split(line, comments=True) for line in _block("README.md", "cachekit build coco/").splitlines()
    ]
    commands = [argv for argv in commands if argv]
    assert [argv[2] for argv in commands] == ["coco/", "yolo/", "voc/JPEGImages"]
    fields = {"coco/": {"boxes"}, "yolo/": {"boxes"}, "voc/JPEGImages": {"mask"}}
    for argv in commands:
        out = tmp_path / argv[argv.index("--out") + 1]
        shutil.rmtree(out, ignore_errors=True)  # the coco and yolo lines are two ways to one cache
        result = CliRunner().invoke(main, [*argv[1:], "--size", "64", "--workers", "1", "--quiet"])
        assert result.exit_code == 0, result.output
        assert "0 skipped" in result.output, result.output
        ds = CachedDataset(out)
        assert len(ds) == 6 and set(ds.fields) == fields[argv[2]], argv
        if "mask" in ds.fields:  # each image's own class map, letterboxed with it
            want = cv2.imread(str(objects / "masks" / "images" / ds.source(0)), cv2.IMREAD_UNCHANGED)
            assert set(ds[0][1]["mask"].unique().tolist()) <= set(want.flatten().tolist()) | {0}
    (line,) = [line for line in _block("README.md", "cachekit preview cache/det").splitlines() if line]
    argv = shlex.split(line)
    result = CliRunner().invoke(main, [*argv[1:], "-n", "4", "--cell", "96"])
    assert result.exit_code == 0, result.output
    assert cv2.imread(str(tmp_path / "batch0.png")).shape[2] == 3


@pytest.mark.slow
def test_the_object_storage_example_reads_through_the_node_cache(s3_endpoint, small_tree, tmp_path):
    url = "s3://datasets/docs-scale-cache"
    options = {"endpoint_url": s3_endpoint}
    build(small_tree, url, BuildConfig(pipeline="train-256", size=48, workers=1, progress=False),
          storage_options=options)  # fmt: skip
    code = _substitute(
        _block("docs/SCALE.md", 'local_cache="/nvme/shards",'),
        {'"s3://bucket/cache"': repr(url), '"/nvme/shards"': repr(str(tmp_path / "shards")),
         '"https://s3.example.com"': repr(s3_endpoint), "ds, 256,": "ds, 4,",
         'device="cuda"': 'device="cpu"'},
    )  # fmt: skip
    scope: dict = {}
    exec(compile(code, "docs/SCALE.md", "exec"), scope)
    labels = torch.cat([y for x, y in scope["loader"]])
    assert len(labels) == len(scope["ds"]) and any((tmp_path / "shards").rglob("*"))


@pytest.mark.slow
def test_the_readme_bench_line_compares_raw_files_with_caches(tmp_path, monkeypatch):
    """README's "see the point in one command", on 6 images instead of 2,000 (~15 s)."""
    (line,) = [line for line in _block("README.md", "cachekit bench --synthetic 2000").splitlines() if line]
    argv = shlex.split(line.replace("--synthetic 2000", "--synthetic 6"), comments=True)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [*argv[1:], "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0] for line in result.stdout.splitlines() if line.startswith(("raw-", "cache-"))}
    assert {"raw-pil", "raw-opencv", "cache-pt", "cache-hdf5", "cache-zarr"} <= rows, result.stdout
    assert "6 samples per epoch in every row" in result.stdout
