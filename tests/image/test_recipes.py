"""Built-in recipes are found by name wherever cachekit is installed, and parse to concrete steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachekit import UsageError, load_pipeline
from cachekit.image.recipes import builtin_pipelines

REPO_PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def test_every_recipe_file_is_a_builtin():
    on_disk = sorted(p.stem for p in REPO_PIPELINES.glob("*.toml"))
    assert on_disk and builtin_pipelines() == on_disk


@pytest.mark.parametrize("name", sorted(p.stem for p in REPO_PIPELINES.glob("*.toml")))
def test_each_builtin_loads_with_concrete_parameters(name):
    pipeline = load_pipeline(name)
    assert pipeline.name == name
    for step in pipeline.steps:
        assert all(not isinstance(v, str) for v in step.params.values()), step


def test_size_rescales_and_unknown_names_are_usage_errors():
    assert load_pipeline("classification-224", 112).steps[0].params["size"] == 128
    with pytest.raises(UsageError, match="built-in: .*letterbox-640"):
        load_pipeline("no-such-recipe")


@pytest.mark.parametrize(
    "value, words",
    [
        ('"size*1/0"', "must be positive, finite numbers"),
        ('"size*0/1"', "must be positive, finite numbers"),
        ('"size*1000000/1"', "from 1 to 8192"),
        ('"size*' + "9" * 300 + '/1"', "far past any image"),
        ('"size*' + "9" * 400 + '/1"', "must be positive"),
        ("100000", "from 1 to 8192"),
        ("-3", "from 1 to 8192"),
        ("22.5", "whole number"),
        ("true", "whole number"),
    ],
)
def test_recipe_sizes_are_bounded_before_any_image_is_made(tmp_path, value, words):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "r"\nsize = 224\n[[steps]]\nop = "resize_shorter"\nsize = {value}\n')
    with pytest.raises(UsageError, match=words):
        load_pipeline(str(recipe))


@pytest.mark.parametrize("size", [0, 8193, 100000, -1])
def test_size_outside_the_limit_is_refused(size):
    with pytest.raises(UsageError, match="--size must be from 1 to 8192"):
        load_pipeline("classification-224", size)


def test_pad_values_are_bytes(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\nsize = 64\n[[steps]]\nop = "letterbox"\nsize = "size"\npad_value = 300\n')
    with pytest.raises(UsageError, match="pad_value must be a whole number from 0 to 255"):
        load_pipeline(str(recipe))


@pytest.mark.parametrize(
    "kind, words", [("binary", "not UTF-8"), ("fifo", "not a regular file"), ("folder", "not a regular file")]
)
def test_a_recipe_file_that_is_not_text_is_one_usage_error(tmp_path, kind, words):
    import os

    path = tmp_path / "r.toml"
    if kind == "binary":
        path.write_bytes(b"\xff\xfe\x00name")
    elif kind == "fifo":
        os.mkfifo(path)  # reading it would wait for a writer for ever
    else:
        path.mkdir()
    with pytest.raises(UsageError, match=words):
        load_pipeline(str(path))
