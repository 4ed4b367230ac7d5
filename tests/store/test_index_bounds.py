"""Each bound the shard index checks when it is mapped, just inside and just past it, on indexes written
from their columns as ``write_index_columns`` writes them (and read back value for value)."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit import CacheError
from cachekit.store.index import ShardIndex, write_index_columns
from cachekit.store.limits import MAX_SHARD_BYTES, MAX_SHARD_ROWS


def _strings(values):
    encoded = [v.encode() for v in values]
    return np.cumsum([0] + [len(e) for e in encoded]), np.frombuffer(b"".join(encoded), np.uint8)


def _cols(**change):
    """The columns of an index of three shards of 2, 0 and 3 samples, then ``change``."""
    cols = {
        "offsets": np.array([0, 2, 2, 5]),
        "bytes": np.array([100, 7, 300]),
        "sha256": np.arange(96, dtype=np.uint8).reshape(3, 32),
        "inputs": np.array([2, 1, 4]),
        "inputs_digest": np.full((3, 32), 9, np.uint8),
        "pixel_sum": np.arange(9.0).reshape(3, 3),
        "pixel_sumsq": np.arange(9.0, 18.0).reshape(3, 3),
        "pixel_count": np.array([40, 0, 60]),
    }
    for key, names in (("name", ["shard-a.pt", "shard-b.pt", "shard-c.pt"]), ("first", ["a/1.jpg", "", "c/1.jpg"]),
                       ("last", ["a/2.jpg", "", "c/3.jpg"])):  # fmt: skip
        cols[f"{key}_offsets"], cols[f"{key}_bytes"] = _strings(names)
    cols.update(change)
    return cols


def _open(tmp_path, cols):
    path = tmp_path / "index.bin"
    write_index_columns(path, cols, 3)
    offsets = np.asarray(cols["offsets"])
    record = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "shards": len(offsets) - 1,
        "samples": int(offsets[-1]),
    }
    return ShardIndex(path, record)


def test_columns_of_any_integer_or_float_type_are_written_as_the_index_stores_them(tmp_path):
    """A caller's int32 counts or lists are stored in the index's own dtypes, and read back equal."""
    given = _cols()
    loose = {k: (v.astype(np.int32) if v.dtype.kind == "i" else v) for k, v in given.items()}
    loose["pixel_sum"] = given["pixel_sum"].tolist()
    loose["bytes"] = given["bytes"].astype(np.float32)
    cols = _open(tmp_path, loose).columns
    for name, value in given.items():
        assert np.array_equal(cols[name], value), name
        assert cols[name].dtype == {"|u1": np.uint8}.get(cols[name].dtype.str, cols[name].dtype)
    assert cols["offsets"].dtype == np.dtype("<i8") and cols["pixel_sum"].dtype == np.dtype("<f8")
    assert (
        _open(tmp_path, loose).text("first", 0) == "a/1.jpg" and _open(tmp_path, loose).text("first", 1) == ""
    )


def test_a_missing_column_is_named(tmp_path):
    cols = _cols()
    del cols["inputs_digest"], cols["last_bytes"]
    with pytest.raises(ValueError, match=r"index columns missing: \['inputs_digest', 'last_bytes'\]"):
        write_index_columns(tmp_path / "index.bin", cols, 3)


BIG = MAX_SHARD_ROWS
REFUSED = {
    "offsets not from 0": (dict(offsets=np.array([1, 2, 2, 5])), "shard offsets are not increasing from 0"),
    "offsets that run down": (dict(offsets=np.array([0, 3, 2, 5])), "shard offsets are not increasing from 0"),
    "a shard of more rows than a shard holds": (
        dict(offsets=np.array([0, 2, 2, BIG + 3])),
        "shard offsets are not increasing from 0",
    ),
    "a shard of no bytes": (dict(bytes=np.array([100, 0, 300])), "a shard size is out of range"),
    "a shard past the largest size": (dict(bytes=np.array([100, MAX_SHARD_BYTES + 1, 3])), "a shard size is out of range"),
    "a shard of no inputs": (dict(inputs=np.array([2, 0, 4])), "an input or pixel count is out of range"),
    "a shard of more inputs than rows": (dict(inputs=np.array([2, BIG + 1, 4])), "an input or pixel count"),
    "a negative pixel count": (dict(pixel_count=np.array([40, -1, 60])), "an input or pixel count"),
    "name offsets not from 0": (dict(name_offsets=np.array([1, 10, 20, 30])), "name offsets are not increasing"),
    "first offsets that run down": (dict(first_offsets=np.array([0, 7, 6, 14])), "first offsets are not increasing"),
    "last offsets short of their buffer": (dict(last_offsets=np.array([0, 7, 7, 13])), "last offsets are not increasing"),
    "an empty file name": (dict(name_offsets=np.array([0, 10, 10, 30])), "a shard has an empty file name"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_each_bound_of_the_index_is_refused_just_past_it(tmp_path, case):
    change, words = REFUSED[case]
    with pytest.raises(CacheError, match=rf"index\.bin: not a valid shard index \({words}"):
        _open(tmp_path, _cols(**change))


def test_values_on_each_bound_are_kept(tmp_path):
    on = _cols(
        offsets=np.array([0, BIG, BIG, BIG + 3]),  # a shard of the most rows, one of none
        bytes=np.array([1, MAX_SHARD_BYTES, 300]),
        inputs=np.array([BIG, 1, 4]),
        pixel_count=np.array([0, 0, 60]),
    )
    cols = _open(tmp_path, on).columns
    assert np.diff(cols["offsets"]).tolist() == [BIG, 0, 3] and cols["bytes"].tolist() == [
        1,
        MAX_SHARD_BYTES,
        300,
    ]
    assert cols["inputs"].tolist() == [BIG, 1, 4] and cols["pixel_count"].tolist() == [0, 0, 60]
