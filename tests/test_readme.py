"""The README's code runs as written (with a test cache and the CPU) and does what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from cachekit import BuildConfig, build

README = Path(__file__).resolve().parents[1] / "README.md"
TRAINING = README.parent / "docs" / "TRAINING.md"
SCALE = README.parent / "docs" / "SCALE.md"


def _python_block(heading: str, page: Path = README) -> str:
    text = page.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _substitute(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in code, f"README changed: {old!r} is no longer in its example"
        code = code.replace(old, new)
    return code


#: What makes a README training loop run here: the CPU, small batches, three epochs, a record.
_ON_THIS_MACHINE = {
    'device="cuda"': 'device="cpu"',
    "256,": "4,",
    "range(90)": "range(3)",
    "        ...": "        seen.append((epoch, labels.tolist(), images.shape, images.dtype))",
}


def _train_then_evaluate(code: str) -> None:
    """Run a README train/val block; three epochs of one mix in three orders, 224x224 crops, float val."""
    scope = {"seen": []}
    exec(compile(code, str(README), "exec"), scope)
    seen = scope["seen"]
    orders = [[y for e, labels, *_ in seen if e == epoch for y in labels] for epoch in range(3)]
    assert all(sorted(o) == sorted(orders[0]) for o in orders) and len({tuple(o) for o in orders}) == 3
    assert {tuple(shape[1:]) for _, _, shape, _ in seen} == {(3, 224, 224)}
    images, _ = next(iter(scope["val"]))
    assert tuple(images.shape[1:]) == (3, 224, 224) and images.dtype == torch.float32


@pytest.mark.slow
def test_the_train_val_loop_of_feeding_gpus_reshuffles_every_epoch(mixed_tree, tmp_path):
    cache = tmp_path / "cache"
    build(mixed_tree, cache, BuildConfig(pipeline="train-256", size=48, workers=1, progress=False))
    code = _substitute(
        _python_block("## Feeding GPUs", TRAINING), {'"cache/"': repr(str(cache)), **_ON_THIS_MACHINE}
    )
    _train_then_evaluate(code)


@pytest.mark.slow
def test_the_first_screen_builds_then_trains_and_evaluates(mixed_tree, tmp_path, monkeypatch):
    import shlex

    from click.testing import CliRunner

    from cachekit.cli import main

    text = README.read_text(encoding="utf-8")
    commands = re.search(r"```bash\n(cachekit build .*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    for line in commands.splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[:2] == ["cachekit", "build"]
        split = argv[2].split("/")[-1]  # raw/train -> the test tree, for both splits
        argv = [*argv[1:2], str(mixed_tree), *argv[3:], "--size", "48", "--workers", "1", "--quiet"]
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 0, result.output
        assert (tmp_path / "cache" / split / "manifest.json").is_file()
    _train_then_evaluate(_substitute(_python_block("# cachekit"), _ON_THIS_MACHINE))


@pytest.mark.slow
def test_the_mixing_example_draws_both_caches_with_their_classes_apart(mixed_tree, tmp_path):
    for name in ("photos", "scans"):  # the README's two caches, one recipe
        build(mixed_tree, tmp_path / name, BuildConfig(size=32, workers=1, progress=False))
    code = _python_block("**Mixing caches.**", TRAINING)
    code = _substitute(
        code,
        {
            '"s3://bucket/photos-cache", local_cache="/nvme/shards"': repr(str(tmp_path / "photos")),
            '"/data/scans-cache"': repr(str(tmp_path / "scans")),
            "256,": "4,",
        },
    )
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    mixed, loader = scope["mixed"], scope["loader"]
    labels = torch.cat([y for _, y in loader])
    assert len(labels) == len(mixed.sources[0]) + len(mixed.sources[1])
    assert mixed.class_offsets == [0, 2] and set(labels.tolist()) == {0, 1, 2, 3}


@pytest.mark.slow
def test_the_detection_example_reads_boxes_moved_with_their_letterbox(tmp_path):
    from cachekit.tools.synthetic_objects import make_object_dataset

    raw = make_object_dataset(tmp_path / "raw", 8, size=(60, 80))
    build(raw, tmp_path / "det", BuildConfig(annotations="yolo", pipeline="letterbox-640", size=96, workers=1,
                                             progress=False))  # fmt: skip
    code = _substitute(
        _python_block("## Detection and segmentation"),
        {'"cache/det"': repr(str(tmp_path / "det")), 'device="cuda"': 'device="cpu"', "64,": "4,",
         "loss = model(": "seen.append((", "for t in targets])": "for t in targets]))"},
    )  # fmt: skip
    scope = {"seen": []}
    exec(compile(code, str(README), "exec"), scope)
    assert scope["target"]["boxes"].dtype == torch.float32 and len(scope["seen"]) == 2
    images, targets = scope["images"], scope["seen"][-1][1]
    assert images.shape[-2:] == (640, 640) and all(t["boxes"].shape[1] == 4 for t in targets)


@pytest.mark.slow
@pytest.mark.parametrize("page", [README, TRAINING], ids=["README", "TRAINING"])
def test_the_deit_recipe_runs_and_gives_soft_labels(page, mixed_tree, tmp_path):
    cache = tmp_path / "train"
    build(mixed_tree, cache, BuildConfig(pipeline="train-256", size=48, workers=1, progress=False))
    heading = "## Training recipes" if page is README else "**DeiT / ViT**"
    code = _substitute(
        _python_block(heading, page),
        {'"cache/train"': repr(str(cache)), 'device="cuda"': 'device="cpu"', "256,": "4,",
         "range(300)": "range(2)"},
    )  # fmt: skip
    code = code.replace("        ...", "        seen.append((images.shape, labels))")
    code = code.replace("logits = model(images)", "logits = torch.zeros(len(images), labels.shape[1])")
    code = code.replace(
        "        loss = torch.sum(", "        seen.append((images.shape, labels)); loss = torch.sum("
    )
    scope = {"seen": []}
    exec(compile(code, str(page), "exec"), scope)
    assert scope["seen"] and all(tuple(shape[1:]) == (3, 224, 224) for shape, _ in scope["seen"])
    for _, labels in scope["seen"]:
        assert labels.dtype.is_floating_point and torch.allclose(
            labels.sum(1), torch.ones(len(labels)), atol=1e-4
        )


@pytest.mark.slow
@pytest.mark.parametrize("page", [README, TRAINING], ids=["README", "TRAINING"])
def test_the_yolo_recipe_runs_and_closes_mosaic(page, tmp_path):
    from cachekit.tools.synthetic_objects import make_object_dataset

    raw = make_object_dataset(tmp_path / "raw", 8, size=(60, 80))
    build(raw, tmp_path / "det", BuildConfig(annotations="yolo", pipeline="max-side-512", size=96, workers=1,
                                             progress=False))  # fmt: skip
    heading = "YOLO on a detection cache" if page is README else "**YOLO**"
    code = _substitute(
        _python_block(heading, page),
        {'"cache/det"': repr(str(tmp_path / "det")), 'device="cuda"': 'device="cpu"', "64,": "4,",
         "epochs, close_mosaic = 100, 10": "epochs, close_mosaic = 3, 1", "(640)": "(96)"},
    )  # fmt: skip
    record = "        seen.append((epoch, images.shape, targets))"
    code = code.replace("        ...", record).replace("        loss = model.loss(images, targets)", record)
    scope = {"seen": []}
    exec(compile(code, str(page), "exec"), scope)
    assert {e for e, _, _ in scope["seen"]} == {0, 1, 2}
    assert all(tuple(shape[-2:]) == (96, 96) and targets.shape[1] == 6 for _, shape, targets in scope["seen"])
    assert type(scope["train"].augment_for(3).steps[0]).__name__ == "Letterbox"


@pytest.mark.parametrize("page", [README, TRAINING], ids=["README", "TRAINING"])
def test_the_yolo_recipe_pads_with_ultralytics_grey(page):
    """Ultralytics fills what its affine moves in with 114 (grey), not black: so does the recipe it names."""
    from cachekit.augment.spec import parse_spec

    heading = "YOLO on a detection cache" if page is README else "**YOLO**"
    code = _python_block(heading, page)
    scope: dict = {}
    exec(compile(code[: code.index("train = make_loader")], str(page), "exec"), scope)
    (affine,) = [t for t in scope["tail"] if type(t).__name__ == "RandomAffine"]
    assert affine.fill == 114 and affine.scale == (0.5, 1.5) and affine.translate == (0.1, 0.1)
    if page is README:  # the preview command beside it draws the same borders
        text = README.read_text(encoding="utf-8")
        command = re.search(r"cachekit preview cache/det --augment \"(.*?)\"", text).group(1)
        (affine,) = [t for t in parse_spec(command) if type(t).__name__ == "RandomAffine"]
        assert affine.fill == 114


def test_every_cachekit_name_doctor_recommends_is_in_the_readme():
    """A user told "use cachekit.X" by doctor finds X in the README, and X exists."""
    import ast

    import cachekit
    import cachekit.tools.advice as advice
    import cachekit.tools.doctor as doctor

    named = set()
    for module in (advice, doctor):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named |= set(re.findall(r"\bcachekit\.([a-z_]+)", node.value))
    assert "autobatch" in named  # the advice when data keeps up
    text = README.read_text(encoding="utf-8")
    for name in sorted(named):
        assert hasattr(cachekit, name), name
        assert re.search(rf"\bcachekit\.{name}\b", text), (
            f"doctor recommends cachekit.{name}; README never names it"
        )
