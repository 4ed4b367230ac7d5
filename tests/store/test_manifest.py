"""The manifest as an untrusted input: malformed, hostile and corrupted caches raise CacheError only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manifests import listed_manifest

from cachekit import CachedDataset, CacheError, read_manifest
from cachekit.store.atomic import sha256_file
from cachekit.store.formats import identity_column
from cachekit.store.limits import MAX_SAMPLE_BYTES, MAX_SAMPLES, MAX_SHARD_ROWS
from cachekit.store.manifest import Manifest
from cachekit.store.manifestio import manifest_text, parse_manifest
from cachekit.store.shardfiles import check_shard_name
from cachekit.tools.report import describe

huge_integers = (
    st.integers(2**31 - 2, 2**31 + 2) | st.integers(2**62, 10**30) | st.sampled_from([10**20, 2**64])
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | huge_integers
    | st.floats()
    | st.text(max_size=12),
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
    return listed_manifest(small_cache)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_malformed_manifests_raise_only_cache_error(good_manifest, data):
    paths = list(_paths(good_manifest))
    path = data.draw(st.sampled_from(paths), label="path")
    value = data.draw(json_values, label="value")
    mutated = _replace(good_manifest, path, value)
    _accepted_or_cache_error(json.dumps(mutated))


def _accepted_or_cache_error(text: str) -> None:
    """A manifest text is refused with a CacheError, or everything a reader does with it works."""
    try:
        m = parse_manifest(text, "manifest.json")
    except CacheError as exc:
        assert str(exc) and len(str(exc)) < 2000  # one line that says what is wrong
        return
    # anything else (KeyError, TypeError, OverflowError, RecursionError, ...) fails the test
    assert 0 <= m.num_samples <= MAX_SAMPLES
    assert all(s.samples <= MAX_SHARD_ROWS for s in m.shards)
    if not m.sample.ragged:
        assert m.sample.nbytes <= MAX_SAMPLE_BYTES
    describe(m)  # what `cachekit info` prints
    manifest_text(m)
    np.concatenate([[0], np.cumsum([s.samples for s in m.shards], dtype=np.int64)])  # the dataset's offsets
    augment = m.pipeline.get("augment")
    if isinstance(augment, dict):
        np.arange(int(augment["variants"]), dtype=np.int64)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_deeply_nested_values_anywhere_raise_only_cache_error(good_manifest, data):
    path = data.draw(st.sampled_from(list(_paths(good_manifest))), label="path")
    depth = data.draw(st.integers(1, 200_000), label="depth")
    opener, closer = data.draw(st.sampled_from([("[", "]"), ('{"a":', "}")]), label="brackets")
    mutated = json.dumps(_replace(good_manifest, path, "@@NESTED@@"))
    _accepted_or_cache_error(mutated.replace('"@@NESTED@@"', opener * depth + "0" + closer * depth))


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
    return dest, listed_manifest(dest)


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
    with pytest.raises(CacheError, match="not a loadable .pt shard") as caught:
        ds[0]
    assert not marker.exists()
    message = str(caught.value)  # torch's advice to load it with weights_only=False is never passed on
    assert "pickled Python objects (getattr)" in message and "nothing of it ran" in message
    assert "weights_only" not in message and "\n" not in message


def test_symlinked_shard_out_of_the_folder_is_refused(small_cache, tmp_path):
    cache, manifest = _copy(small_cache, tmp_path / "c")
    victim = cache / manifest["shards"][1]["file"]
    outside = tmp_path / "elsewhere.pt"
    shutil.move(victim, outside)
    victim.symlink_to(outside)
    ds = CachedDataset(cache)  # shards are checked when first read, not all at open
    with pytest.raises(CacheError, match="symlink out of the cache folder"):
        ds.read_batch(np.arange(len(ds)))


def test_a_shard_with_other_shapes_is_refused(small_cache, tmp_path):
    cache, manifest = _copy(small_cache, tmp_path / "c")
    name = manifest["shards"][0]["file"]
    torch.save(
        {
            "images": torch.zeros(7, 3, 16, 16, dtype=torch.uint8),
            "labels": torch.zeros(7, dtype=torch.int64),
            "shard_name": torch.from_numpy(identity_column(name)),
        },
        cache / name,
    )
    _rewrite(cache, manifest, 0)
    with pytest.raises(
        CacheError, match=r"'images' is uint8\[7, 3, 16, 16\], manifest says uint8\[7, 3, 32, 32\]"
    ):
        CachedDataset(cache)[0]


def test_manifest_round_trips(small_cache):
    m = read_manifest(small_cache)
    assert Manifest.from_json(json.loads(json.dumps(m.to_json())), m.shards) == m


def _set(path):
    def mutate(m, value):
        node = m
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = value

    return mutate


HUGE = {
    "samples=10**20": (lambda m: (m["shards"][0].update(samples=10**20), m.update(num_samples=10**20 + 33))),
    "shape [3, 2**31-1, 2**31-1]": (lambda m: m["sample"].update(shape=[3, 2**31 - 1, 2**31 - 1])),
    "an extra of 2**40 bytes": (
        lambda m: m["sample"]["extras"].update(big={"shape": [2**20, 2**20], "dtype": "|u1"})
    ),
    "augment.variants=10**30": (lambda m: m["pipeline"].update(augment={"variants": 10**30})),
    "num_samples=10**30": (lambda m: m.update(num_samples=10**30)),
    "shard bytes=2**70": (lambda m: m["shards"][0].update(bytes=2**70)),
    "inputs=2**64": (lambda m: m["shards"][0].update(inputs=2**64)),
    "an integer of 5,000 digits": (lambda m: m["shards"][0].update(pixel_count="@@DIGITS@@")),
    "100,000 nested brackets": (lambda m: m["source"].update(nested="@@NESTED@@")),
    "100,000 nested objects at the top": (lambda m: m.update(extra="@@OBJECTS@@")),
}


@pytest.mark.parametrize("case", list(HUGE))
def test_huge_and_deep_manifests_are_one_line_errors(small_cache, tmp_path, case):
    from click.testing import CliRunner

    from cachekit.cli import main

    cache = tmp_path / "c"
    shutil.copytree(small_cache, cache)
    manifest = listed_manifest(cache)
    HUGE[case](manifest)
    text = (
        json.dumps(manifest)
        .replace('"@@NESTED@@"', "[" * 100_000 + "]" * 100_000)
        .replace('"@@OBJECTS@@"', '{"a":' * 100_000 + "0" + "}" * 100_000)
        .replace('"@@DIGITS@@"', "7" * 5000)
    )
    (cache / "manifest.json").write_text(text)
    with pytest.raises(CacheError):
        read_manifest(cache)
    with pytest.raises(CacheError):
        CachedDataset(cache)
    for command in ("info", "verify"):
        result = CliRunner().invoke(main, [command, str(cache)])
        assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), result.output
        assert result.output.startswith("error: ") and result.output.count("\n") == 1


def test_every_torch_load_in_cachekit_refuses_pickled_code():
    """``weights_only=True`` on every call: torch < 2.6 (which pyproject allows) loads pickles
    that run code by default; the suite's own torch would not notice the flag missing."""
    import ast

    import cachekit

    calls = []
    for path in Path(cachekit.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "load":
                if isinstance(func.value, ast.Name) and func.value.id == "torch":
                    flags = {k.arg: getattr(k.value, "value", None) for k in node.keywords}
                    calls.append((path.name, node.lineno, flags.get("weights_only")))
    assert calls and all(flag is True for *_, flag in calls), calls


def test_a_pt_shard_is_opened_with_weights_only(small_cache, monkeypatch):
    import torch

    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    CachedDataset(small_cache)[0]
    assert seen == [True]


@pytest.mark.parametrize(
    "steps",
    [
        "rm -rf /",
        [1, 2],
        [{"op": "os.system", "size": 1}],
        [{"size": 224}],
        [{"op": "resize_shorter", "size": -1}],
        [{"op": "resize_shorter", "size": 10**9}],
        [{"op": "center_crop", "size": 224, "pad_value": 1000}],
        [{"op": "center_crop", "size": "224"}],
        [{"op": "resize_shorter", "size": 224, "command": "touch /tmp/x"}],
        [{"op": "resize_shorter", "size": 224}] * 65,
    ],
)
def test_garbage_recipe_steps_in_a_manifest_are_refused_when_it_is_read(good_manifest, steps):
    obj = json.loads(json.dumps(good_manifest))
    obj["pipeline"]["steps"] = steps
    with pytest.raises(CacheError, match=r"manifest\.pipeline: steps"):
        parse_manifest(json.dumps(obj), "manifest.json")


@pytest.mark.parametrize("field, value", [("name", 5), ("size", 0), ("size", 10**9), ("size", "224")])
def test_garbage_recipe_name_or_size_in_a_manifest_is_refused(good_manifest, field, value):
    obj = json.loads(json.dumps(good_manifest))
    obj["pipeline"][field] = value
    with pytest.raises(CacheError, match=rf"manifest\.pipeline: {field}"):
        parse_manifest(json.dumps(obj), "manifest.json")


@pytest.mark.parametrize("key", ["sha256", "inputs_digest"])
def test_a_shard_digest_with_a_final_newline_is_refused(small_cache, key):
    from cachekit.store.manifest import ShardInfo

    shard = read_manifest(small_cache).shards[0].to_json()
    assert ShardInfo.from_json(dict(shard), "shards[0]").sha256 == shard["sha256"]
    with pytest.raises(CacheError, match=rf"shards\[0\]\.{key}: expected 64 lowercase hex digits"):
        ShardInfo.from_json({**shard, key: shard[key] + "\n"}, "shards[0]")  # "$" alone lets the newline in
