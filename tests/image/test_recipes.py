"""Built-in recipes are found by name wherever cachekit is installed, and parse to concrete steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachekit import UsageError, load_pipeline
from cachekit.image.recipes import builtin_pipelines

REPO_PIPELINES = Path(__file__).resolve().parents[2] / "cachekit" / "pipelines"


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
