"""A Python dataset built on a dask.distributed cluster: split by index over its workers, byte-identical
to the local build (the workers unpickle the dataset, so they import its module)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sourcekit import ObjectDataset, make_objects

from cachekit import BuildConfig, build, read_manifest

distributed = pytest.importorskip("dask.distributed")


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def _build_on_dask(samples, out: Path, config: dict, **options):
    """``build`` of ``samples`` on a two-worker LocalCluster of its own."""
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster),
    ):
        on_dask = BuildConfig(executor="dask", executor_options={"scheduler": cluster.scheduler_address}, **config)
        return build(samples, out, on_dask, **options)


def _assert_same_as_local(root: Path) -> None:
    """The shards under ``root / "dask"`` byte for byte those under ``root / "local"``, and the manifests
    the same but for their creation time."""
    assert _files(root / "dask") == _files(root / "local")
    a, b = (read_manifest(root / d).to_json() | {"created": ""} for d in ("dask", "local"))
    assert a == b


@pytest.mark.slow  # a cluster of its own: ~15 s
def test_a_dataset_on_dask_is_byte_identical_to_the_local_build(tmp_path, monkeypatch):
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    _, items = make_objects(tmp_path / "raw", 6)
    config = dict(pipeline="letterbox-640", size=48, shard_size=2, progress=False)
    build(
        ObjectDataset(items, "array"), tmp_path / "local", BuildConfig(workers=2, **config), box_format="xywh"
    )
    result = _build_on_dask(ObjectDataset(items, "array"), tmp_path / "dask", config, box_format="xywh")
    assert result.built_shards == len(result.manifest.shards) > 1
    _assert_same_as_local(tmp_path)


@pytest.mark.slow  # a cluster of its own: ~15 s
def test_a_stream_on_dask_is_byte_identical_to_the_local_build(tmp_path):
    """A generator's shards go to the cluster a wave at a time, with the undo its workers run if the
    build gives them up; the bytes are the local build's."""
    from sourcekit import object_stream

    from cachekit.tools.synthetic_objects import object_classes

    _, items = make_objects(tmp_path / "raw", 6)
    config = dict(pipeline="letterbox-640", size=48, shard_size=2, progress=False, order="sorted")
    names = object_classes(3)
    build(object_stream(items), tmp_path / "local", BuildConfig(workers=2, **config), box_format="xywh",
          classes=names)  # fmt: skip
    result = _build_on_dask(object_stream(items), tmp_path / "dask", {**config, "workers": 2}, box_format="xywh",
                            classes=names)  # fmt: skip
    assert result.status == "built" and result.built_shards == len(result.manifest.shards) == 3
    _assert_same_as_local(tmp_path)
