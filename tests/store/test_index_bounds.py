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


def test_the_shapes_of_columns_are_the_index_counts_and_channels(tmp_path):
    """A column of another length (shards, offsets or channels), with a missing dimension or of
    another dtype is refused by name; a 1-byte file name, empty first and last names and a cache of
    one channel are fine."""
    for change, words in (
        (dict(bytes=np.array([100, 7, 300, 4])), r"column bytes is <i8 \[4\], expected <i8 \[3\]"),
        (
            dict(name_offsets=np.array([0, 10, 20, 30, 30])),
            r"column name_offsets is <i8 \[5\], expected <i8 \[4\]",
        ),
        (dict(pixel_sum=np.zeros((3, 1))), r"column pixel_sum is <f8 \[3, 1\], expected <f8 \[3, 3\]"),
        (dict(sha256=np.zeros(96, np.uint8)), r"column sha256 is \|u1 \[96\], expected \|u1 \[3, -1\]"),
    ):
        with pytest.raises(CacheError, match=words):
            _open(tmp_path, _cols(**change))
    ok = _cols(**dict(zip(("name_offsets", "name_bytes"), _strings(["a", "b", "c"]))))
    for key in ("first", "last"):
        ok[f"{key}_offsets"], ok[f"{key}_bytes"] = _strings(["", "", ""])
    index = _open(tmp_path, ok)
    assert [index.text("name", k) for k in range(3)] == ["a", "b", "c"] and index.text("last", 2) == ""
    path = tmp_path / "index.bin"
    write_index_columns(path, _cols(pixel_sum=np.ones((3, 1)), pixel_sumsq=np.ones((3, 1))), 1)
    record = {"file": path.name, "bytes": path.stat().st_size, "shards": 3, "samples": 5}
    assert ShardIndex(path, record).columns["pixel_sum"].shape == (3, 1)
    write_index_columns(path, _cols(pixel_sum=np.ones((3, 2)), pixel_sumsq=np.ones((3, 2))), 2)
    with pytest.raises(CacheError, match="its counts are not the manifest's"):  # 1 or 3 channels only
        ShardIndex(path, record | {"bytes": path.stat().st_size})
    write_index_columns(path, _cols(), 3)
    with pytest.raises(CacheError, match="its counts are not the manifest's"):
        ShardIndex(path, record | {"bytes": path.stat().st_size, "shards": 4})


def test_a_file_too_short_of_another_version_or_header_length_is_refused_by_its_reason(tmp_path):
    import struct

    path = tmp_path / "index.bin"
    write_index_columns(path, _cols(), 3)
    good = path.read_bytes()
    length = int.from_bytes(good[12:16], "little")
    cases = {
        "too short": good[:15],
        "bad magic, version or header": good[:16],  # a head and nothing after it
        "bad magic, version or header ": good[:8] + struct.pack("<I", 2) + good[12:],  # version 2
        " bad magic, version or header": good[:12] + struct.pack("<I", len(good) - 10) + good[16:],
        "bad header: ": good[:16] + b"x" + good[17:],  # not JSON
    }
    for words, data in cases.items():
        path.write_bytes(data)
        record = {"file": path.name, "bytes": len(data), "shards": 3, "samples": 5}
        with pytest.raises(CacheError, match=rf"index\.bin: not a valid shard index \({words.strip()}"):
            ShardIndex(path, record)
    assert length < len(good)


def test_an_index_that_is_a_link_or_missing_is_refused_in_one_line(tmp_path):
    real = tmp_path / "real.bin"
    write_index_columns(real, _cols(), 3)
    link = tmp_path / "index.bin"
    link.symlink_to(real)  # opened without following links
    record = {"file": link.name, "bytes": real.stat().st_size, "shards": 3, "samples": 5}
    with pytest.raises(
        CacheError, match=r"the shard index cannot be opened \(Too many levels of symbolic links\)$"
    ):
        ShardIndex(link, record)
    with pytest.raises(CacheError, match="index-none.bin: the cache's shard index is missing"):
        ShardIndex(tmp_path / "index-none.bin", record)
    lazy = ShardIndex(tmp_path / "index-none.bin", record, lazy=True)  # mapped when first used
    with pytest.raises(CacheError, match="missing"):
        len(lazy.columns)
    assert len(lazy) == 3


GOOD_RECORD = {
    "file": "index-ab.bin",
    "version": 1,
    "bytes": 4096,
    "sha256": "ab" * 32,
    "shards": 3,
    "samples": 5,
}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"version": True}, r"idx\.version: expected a whole number from 0 to 2147483648, got True"),
        ({"bytes": -1}, r"idx\.bytes: expected a whole number from 0 to 281474976710656, got -1"),
        ({"bytes": 2**48 + 1}, r"idx\.bytes: expected a whole number"),
        ({"shards": 2**40 + 1}, r"idx\.shards: expected a whole number from 0 to 1099511627776"),
        ({"samples": 5.0}, r"idx\.samples: expected a whole number from 0 to 1099511627776, got 5\.0"),
        ({"samples": None}, r"idx\.samples: expected a whole number"),
        ({"version": 2}, r"index format mismatch: code=1, file=2; rebuild the cache"),
        ({"shards": 0}, r"idx\.shards: a cache has at least one shard"),
        ({"sha256": "AB" * 32}, r"idx\.sha256: expected 64 lowercase hex digits, got 'ABAB"),
        ({"sha256": "ab" * 32 + "\n"}, r"idx\.sha256: expected 64 lowercase hex digits"),
        ({"file": "../index.bin"}, r"idx\.file: '\.\./index\.bin' is not a plain file name"),
    ],
)
def test_the_manifests_index_record_is_checked_key_by_key(change, words):
    from cachekit.store.index import check_record

    with pytest.raises(CacheError, match=words):
        check_record(GOOD_RECORD | change, "idx")


def test_a_record_on_each_bound_is_kept():
    from cachekit.store.index import check_record, index_record

    for change in (
        {},
        {"bytes": 0, "samples": 0, "shards": 1},
        {"bytes": 2**48, "samples": 2**40, "shards": 2**40},
    ):
        record = GOOD_RECORD | change
        assert check_record(record, "idx") == record
    made = index_record("index-ab.bin", np.int64(4096), "ab" * 32, np.int64(3), 5)
    assert made == GOOD_RECORD and all(type(v) is type(GOOD_RECORD[k]) for k, v in made.items())
    with pytest.raises(CacheError, match=r"idx: expected an object, got \['file'\]"):
        check_record(["file"], "idx")


@pytest.mark.parametrize("where", ["unaligned", "past the end", "negative"])
def test_a_column_off_its_alignment_or_outside_the_file_is_refused(tmp_path, where):
    import json

    path = tmp_path / "index.bin"
    write_index_columns(path, _cols(), 3)
    data = path.read_bytes()
    length = int.from_bytes(data[12:16], "little")
    header = json.loads(data[16 : 16 + length])
    column = header["columns"][1]  # bytes: 3 int64s
    column["offset"] = {
        "unaligned": column["offset"] + 8,
        "past the end": -(-len(data) // 64) * 64 - 64,
        "negative": -64,
    }[where]
    text = json.dumps(header).encode().ljust(length)
    path.write_bytes(data[:16] + text + data[16 + length :])
    record = {"file": path.name, "bytes": len(data), "shards": 3, "samples": 5}
    with pytest.raises(CacheError, match=r"not a valid shard index \(column bytes lies outside the file\)"):
        ShardIndex(path, record)


@pytest.mark.parametrize("where", ["zero", "last aligned inside", "at its end"])
def test_a_column_inside_the_header_is_refused(tmp_path, where):
    """A column may not start inside the magic, version and JSON header (at offset 0 it would read
    them as numbers); one starting where the header ends is read. The header is padded here to end
    exactly at the first column, on the 64-byte alignment."""
    import json

    path = tmp_path / "index.bin"
    write_index_columns(path, _cols(), 3)
    data = path.read_bytes()
    length = int.from_bytes(data[12:16], "little")
    header = json.loads(data[16 : 16 + length])
    first = header["columns"][0]["offset"]  # offsets: the first column, where the header's room ends
    assert first % 64 == 0 and first > 16 + length - 64
    column = header["columns"][1]  # bytes: 3 int64s
    if where != "at its end":
        column["offset"] = {"zero": 0, "last aligned inside": first - 64}[where]
    text = json.dumps(header).encode().ljust(first - 16)
    path.write_bytes(data[:12] + (first - 16).to_bytes(4, "little") + text + data[first:])
    record = {"file": path.name, "bytes": len(data), "shards": 3, "samples": 5}
    if where == "at its end":
        assert ShardIndex(path, record).columns["offsets"].tolist() == [0, 2, 2, 5]
        return
    with pytest.raises(CacheError, match=r"^\S+: not a valid shard index \(column bytes lies inside the header "
                       rf"\(offset {column['offset']}, the header ends at {first}\)\); rebuild"):  # fmt: skip
        ShardIndex(path, record)
