"""The manifest as an untrusted input: malformed, hostile and corrupted caches raise CacheError only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachekit import CachedDataset, CacheError, read_manifest
from cachekit.store.atomic import sha256_file
from cachekit.store.manifest import Manifest, check_shard_name

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def _paths(obj, prefix=()):
    """Every (path, value) inside a JSON document, the root included."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _replace(obj, path, value):
    if not path:
        return value
    obj = json.loads(json.dumps(obj))
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return obj


@pytest.fixture(scope="module")
def good_manifest(small_cache):
    return json.loads((small_cache / "manifest.json").read_text())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_malformed_manifests_raise_only_cache_error(good_manifest, data):
    paths = list(_paths(good_manifest))
    path = data.draw(st.sampled_from(paths), label="path")
    value = data.draw(json_values, label="value")
    mutated = _replace(good_manifest, path, value)
    try:
        Manifest.from_json(mutated)
    except CacheError as exc:
        assert str(exc)  # a message that says what is wrong
    # anything else (KeyError, TypeError, ...) fails the test


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=30))
def test_shard_names_are_plain_files_or_refused(name):
    try:
        checked = check_shard_name(name)
    except CacheError:
        return
    assert (
        "/" not in checked and "\\" not in checked and ".." not in checked and checked == Path(checked).name
    )


def _copy(cache: Path, dest: Path) -> tuple[Path, dict]:
    shutil.copytree(cache, dest)
    return dest, json.loads((dest / "manifest.json").read_text())


def _rewrite(cache: Path, manifest: dict, shard: int) -> None:
    """Make the manifest agree with a replaced shard's size and checksum, as an attacker would."""
    info = manifest["shards"][shard]
    info["bytes"] = (cache / info["file"]).stat().st_size
    info["sha256"] = sha256_file(cache / info["file"])
    (cache / "manifest.json").write_text(json.dumps(manifest))


def test_a_pickle_payload_in_a_pt_shard_never_runs(small_cache, tmp_path):
    cache, manifest = _copy(small_cache, tmp_path / "c")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save(
        {"images": Payload(), "labels": torch.zeros(7, dtype=torch.int64)},
        cache / manifest["shards"][0]["file"],
    )
    _rewrite(cache, manifest, 0)
    ds = CachedDataset(cache)
    with pytest.raises(CacheError, match="not a loadable .pt shard"):
        ds[0]
    assert not marker.exists()


def test_symlinked_shard_out_of_the_folder_is_refused(small_cache, tmp_path):
    cache, manifest = _copy(small_cache, tmp_path / "c")
    victim = cache / manifest["shards"][1]["file"]
    outside = tmp_path / "elsewhere.pt"
    shutil.move(victim, outside)
    victim.symlink_to(outside)
    with pytest.raises(CacheError, match="symlink out of the cache folder"):
        CachedDataset(cache)


def test_a_shard_with_other_shapes_is_refused(small_cache, tmp_path):
    cache, manifest = _copy(small_cache, tmp_path / "c")
    name = manifest["shards"][0]["file"]
    torch.save(
        {"images": torch.zeros(7, 3, 16, 16, dtype=torch.uint8), "labels": torch.zeros(7, dtype=torch.int64)},
        cache / name,
    )
    _rewrite(cache, manifest, 0)
    with pytest.raises(
        CacheError, match=r"'images' is uint8\[7, 3, 16, 16\], manifest says uint8\[7, 3, 32, 32\]"
    ):
        CachedDataset(cache)[0]


def test_manifest_round_trips(small_cache):
    m = read_manifest(small_cache)
    assert Manifest.from_json(json.loads(json.dumps(m.to_json()))) == m
