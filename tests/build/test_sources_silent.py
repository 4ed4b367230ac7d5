"""Sources that cannot change a cache's data in silence: a resumed iterable that yields other samples,
fields that appear after the first samples, damaged tar headers, Parquet columns that are not there,
class names and crowd flags that a source states."""

from __future__ import annotations

import pytest
from sourcekit import make_objects, object_stream

from cachekit import BuildConfig, CachedDataset, UsageError, build, read_manifest
from cachekit.tools.synthetic_objects import object_classes

QUIET = {"workers": 2, "progress": False, "order": "sorted", "shard_size": 3}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_objects(tmp_path_factory.mktemp("objects") / "raw")


def _breaking(samples, at: int):
    for k, sample in enumerate(samples):
        if k == at:
            raise ConnectionError("the stream's server went away")
        yield sample


def _stream_build(samples, out, config=BuildConfig(**QUIET)):
    return build(samples, out, config, box_format="xywh", classes=object_classes(3), source_id="s")


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "manifest.json"}


def test_a_resumed_iterable_that_yields_another_order_is_refused(objects, tmp_path):
    _, items = objects
    with pytest.raises(UsageError, match="raised at sample 7"):
        _stream_build(_breaking(object_stream(items), 7), tmp_path / "c")
    shuffled = list(object_stream(items))
    shuffled = shuffled[1:] + shuffled[:1]  # another order: every finished shard holds other samples
    with pytest.raises(UsageError, match="other samples than the build it resumes.*repeat its order"):
        _stream_build(iter(shuffled), tmp_path / "c")
    assert not (tmp_path / "c" / "manifest.json").exists()
    again = _stream_build(object_stream(items), tmp_path / "c")  # the same order: resumed, clean bytes
    assert again.status == "resumed" and (again.reused_shards, again.built_shards) == (2, 1)
    _stream_build(object_stream(items), tmp_path / "clean")
    assert _files(tmp_path / "c") == _files(tmp_path / "clean")


def test_a_resumed_iterable_whose_finished_shard_changed_is_refused_and_overwrite_rebuilds_it(
    objects, tmp_path
):
    _, items = objects
    with pytest.raises(UsageError, match="raised at sample 7"):
        _stream_build(_breaking(object_stream(items), 7), tmp_path / "c")
    changed = list(object_stream(items))
    changed[4] = {**changed[4], "text": "another caption"}  # one sample of the second finished shard
    with pytest.raises(UsageError, match=r"samples 3 to 5\).*rebuild with --overwrite"):
        _stream_build(iter(changed), tmp_path / "c")
    redone = _stream_build(iter(changed), tmp_path / "c", BuildConfig(**QUIET, overwrite=True))
    assert redone.manifest.num_samples == len(items)
    assert CachedDataset(tmp_path / "c")[4][1]["text"] == "another caption"
    assert CachedDataset(tmp_path / "c")[3][1]["text"] == items[3].text
    assert read_manifest(tmp_path / "c").source["layout"] == "stream"
