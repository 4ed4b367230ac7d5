"""The fields format_version 3 adds: order, limits, skipped[].retry, and file names that are not UTF-8."""

from __future__ import annotations

import json
import os

import pytest
from manifests import listed_manifest

from cachekit import CacheError, read_manifest
from cachekit.store.manifest import Manifest
from cachekit.store.manifestio import json_text, manifest_text, parse_manifest


def _manifest(small_cache) -> dict:
    return listed_manifest(small_cache)


def test_the_new_fields_round_trip(small_cache):
    m = read_manifest(small_cache)
    assert m.order == {"kind": "sorted"} and not m.shards_mixed
    assert m.limits == {"max_pixels": 178_956_970}
    obj = _manifest(small_cache)
    obj["order"] = {"kind": "shuffled", "seed": -3, "shards": 6}
    obj["skipped"] = [{"path": "a.jpg", "reason": "unreadable: Input/output error", "retry": True}]
    again = Manifest.from_json(obj)
    assert again.shards_mixed and again.skipped[0].retry
    assert Manifest.from_json(json.loads(manifest_text(again))) == again


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("order", {"kind": "random"}, "order.kind"),
        ("order", {"kind": "shuffled", "seed": 0}, "shards"),
        ("order", {"kind": "shuffled", "seed": "0", "shards": 2}, "order.seed"),
        ("order", {"kind": "shuffled", "seed": 0, "shards": 0}, "order.shards"),
        ("order", "shuffled", "expected an object"),
        ("limits", {"max_pixels": -1}, "limits.max_pixels"),
        ("limits", {}, "max_pixels"),
    ],
)
def test_bad_new_fields_are_cache_errors(small_cache, field, value, words):
    obj = _manifest(small_cache)
    obj[field] = value
    with pytest.raises(CacheError, match=words):
        parse_manifest(json.dumps(obj), "manifest.json")


def test_a_non_boolean_retry_is_refused(small_cache):
    obj = _manifest(small_cache)
    obj["skipped"] = [{"path": "a.jpg", "reason": "x", "retry": "yes"}]
    with pytest.raises(CacheError, match="retry"):
        parse_manifest(json.dumps(obj), "manifest.json")


def test_non_utf8_names_are_escaped_and_come_back_as_the_same_bytes():
    name = os.fsdecode(b"cat/caf\xe9 \xff.jpg")
    text = json_text({"path": name, "other": "Ünïcödé"})
    assert text.encode("utf-8") and "\\udce9" in text and "Ünïcödé" in text  # valid UTF-8 text
    assert os.fsencode(json.loads(text)["path"]) == b"cat/caf\xe9 \xff.jpg"
