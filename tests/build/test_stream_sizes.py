"""A stream's shard size: the recipe's bytes per sample when none is given, and the size it was built
with when it is resumed or run again without one; what a stream build reports and refuses."""

from __future__ import annotations

import pytest
from sourcekit import breaking, make_objects, object_stream

from cachekit import BuildConfig, CachedDataset, UsageError, build, read_manifest
from cachekit.build import streamrun
from cachekit.tools.synthetic_objects import object_classes

QUIET = {"workers": 1, "progress": False, "order": "sorted"}
RECIPE = {"pipeline": "letterbox-640", "size": 16}  # 3 x 16 x 16 = 768 bytes a sample
SAMPLE_BYTES = 3 * 16 * 16


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_objects(tmp_path_factory.mktemp("objects") / "raw")


def _build(samples, out, **options):
    config = BuildConfig(**{**QUIET, **RECIPE, **options})
    return build(samples, out, config, box_format="xywh", classes=object_classes(3), source_id="s")


def _size(out) -> int:
    return read_manifest(out).format_options["shard_size"]


@pytest.mark.parametrize("target, size", [(SAMPLE_BYTES * 20, 20), (SAMPLE_BYTES * 20 + SAMPLE_BYTES - 1, 20),
                                          (SAMPLE_BYTES * 3, 16), (SAMPLE_BYTES * 200_001, 100_000)])  # fmt: skip
def test_without_a_shard_size_a_stream_takes_the_target_bytes_over_a_sample_s_bytes(
    objects, tmp_path, monkeypatch, target, size
):
    """The size is the shard target over the recipe's bytes per sample, at least 16 and at most 100000."""
    _, items = objects
    monkeypatch.setattr(streamrun, "DEFAULT_SHARD_BYTES", target)
    result = _build(object_stream(items), tmp_path / "c")
    assert _size(tmp_path / "c") == size and len(result.manifest.shards) == 1
    assert result.manifest.num_samples == len(items)


def test_a_resumed_stream_keeps_the_shard_size_it_began_with(objects, tmp_path):
    _, items = objects
    with pytest.raises(UsageError, match="raised at sample 7"):
        _build(breaking(object_stream(items), 7), tmp_path / "c", shard_size=3)
    again = _build(object_stream(items), tmp_path / "c")  # no size given: the unfinished build's 3
    assert again.status == "resumed" and (again.reused_shards, again.built_shards) == (2, 1)
    assert _size(tmp_path / "c") == 3 and len(again.manifest.shards) == 3


@pytest.mark.parametrize("size", [1, 3])
def test_a_finished_stream_run_again_without_a_size_is_up_to_date_at_its_size(objects, tmp_path, size):
    _, items = objects
    first = _build(object_stream(items), tmp_path / "c", shard_size=size)
    assert first.status == "built" and (first.built_shards, first.reused_shards) == (-(-len(items) // size), 0)
    again = _build(object_stream(items), tmp_path / "c")
    assert again.status == "up to date" and _size(tmp_path / "c") == size
    assert again.built_shards == 0


def test_overwrite_without_a_size_rebuilds_a_stream_at_the_default_size(objects, tmp_path, monkeypatch):
    _, items = objects
    _build(object_stream(items), tmp_path / "c", shard_size=3)
    monkeypatch.setattr(streamrun, "DEFAULT_SHARD_BYTES", SAMPLE_BYTES * 20)
    redone = _build(object_stream(items), tmp_path / "c", overwrite=True)
    assert redone.status == "built" and _size(tmp_path / "c") == 20 and len(redone.manifest.shards) == 1
    assert CachedDataset(tmp_path / "c")[5][1]["text"] == items[5].text


def test_a_stream_built_with_default_workers_and_order_is_stored_in_the_order_it_was_read(objects, tmp_path):
    """No workers and no order given: a worker's worth of shards at a time, and the stream's own order
    (it cannot be shuffled before it is read), each shard built once."""
    _, items = objects
    config = BuildConfig(progress=False, shard_size=3, **RECIPE)
    result = build(object_stream(items), tmp_path / "c", config, box_format="xywh", classes=object_classes(3))
    assert result.status == "built" and (result.built_shards, result.reused_shards) == (3, 0)
    assert read_manifest(tmp_path / "c").order["kind"] == "sorted"
    ds = CachedDataset(tmp_path / "c")
    assert [ds[i][1]["text"] for i in range(len(items))] == [it.text for it in items]


def test_an_empty_stream_is_one_line(objects, tmp_path):
    with pytest.raises(UsageError, match=r"^the iterable yields no samples: nothing to build$"):
        _build(iter([]), tmp_path / "c", shard_size=3)


def test_a_stream_into_a_cache_of_other_options_names_them_in_one_line(objects, tmp_path):
    _, items = objects
    _build(object_stream(items), tmp_path / "c", shard_size=3)
    with pytest.raises(UsageError, match=r"holds a cache built with other options \(.*shard.*\); pass --overwrite"):
        _build(object_stream(items), tmp_path / "c", shard_size=2)
    assert _size(tmp_path / "c") == 3


def test_a_stream_goes_on_over_an_unfinished_build_of_another_stream(objects, tmp_path):
    """An unfinished build of other inputs is taken over as ``--update`` takes it (a stream cannot be
    asked to start again), not refused: the cache ends with this stream's samples."""
    _, items = objects
    with pytest.raises(UsageError, match="raised at sample 7"):
        build(breaking(object_stream(items), 7), tmp_path / "c", BuildConfig(**QUIET, **RECIPE, shard_size=3),
              box_format="xywh", classes=object_classes(3), source_id="first")  # fmt: skip
    changed = [{**s, "text": f"caption {k}"} for k, s in enumerate(object_stream(items))]
    result = build(iter(changed), tmp_path / "c", BuildConfig(**QUIET, **RECIPE, shard_size=3), box_format="xywh",
                   classes=object_classes(3), source_id="second")  # fmt: skip
    assert result.manifest.num_samples == len(items)
    ds = CachedDataset(tmp_path / "c")
    assert [ds[i][1]["text"] for i in range(len(items))] == [f"caption {k}" for k in range(len(items))]
