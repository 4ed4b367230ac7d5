"""Reading ragged fields costs memory in proportion to what is read: a sample with a 20 MB caption
is gathered and decoded with a small multiple of 20 MB (numpy reports its allocations to
tracemalloc), never an int64 index per caption byte; and the gather returns exactly the values of
the rows asked for, as fresh arrays, whichever way it copies them."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, CacheError, build, read_manifest
from cachekit.store.fields import base
from cachekit.store.fields.base import pack_ragged, ragged_gather, ragged_rows
from cachekit.store.formats import get_format
from cachekit.store.manifest import shard_path

BIG = 20 << 20  # bytes of the long caption


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    """A cache from code of six small images with captions, one of them 20 MB (ASCII)."""
    rng = np.random.default_rng(3)
    samples = [
        {"image": rng.integers(0, 256, (12, 16, 3), dtype=np.uint8), "text": f"caption {i}"} for i in range(6)
    ]
    samples[4]["text"] = "the long one " + "x" * (BIG - 13)
    out = tmp_path_factory.mktemp("captions") / "c"
    build(samples, out, BuildConfig(pipeline="none", workers=1, progress=False))
    return out


def _peak(fn):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_gathering_a_large_value_peaks_at_a_small_multiple_of_its_size(captions):
    m = read_manifest(captions)
    (info,) = m.shards
    reader = get_format(m.format, reading=True).open(
        shard_path(captions, info), m.sample, info.samples, m.format_options.get("store", "pixels")
    )
    try:
        ends = np.asarray(reader.column("text__offsets", slice(None)))
        row = int(np.argmax(np.diff(ends)))
        assert ends[row + 1] - ends[row] == BIG
        for rows in ([row], [row - 1, row, row + 1], [row, 0, row]):
            (counts, (values,)), peak = _peak(
                lambda rows=rows: ragged_gather(
                    reader.column, "text__utf8", "text__offsets", rows, info.samples
                )
            )
            assert int(counts.sum()) == values.nbytes >= BIG and values.dtype == np.uint8
            assert peak < 3 * values.nbytes, f"{peak / values.nbytes:.1f}x the bytes returned"
            start = int(counts[: rows.index(row)].sum())
            assert values[start : start + 13].tobytes() == b"the long one "
    finally:
        reader.close()


def test_reading_the_sample_with_a_large_caption_peaks_at_a_small_multiple_of_it(captions):
    ds = CachedDataset(captions)
    m = read_manifest(captions)
    (info,) = m.shards  # one shard: a sample's index is its row
    reader = get_format(m.format, reading=True).open(
        shard_path(captions, info), m.sample, info.samples, m.format_options.get("store", "pixels")
    )
    try:
        long = int(np.argmax(np.diff(np.asarray(reader.column("text__offsets", slice(None))))))
    finally:
        reader.close()
    assert ds[(long + 1) % len(ds)][1]["text"].startswith("caption ")  # the shard is open and checked
    (_, target), peak = _peak(lambda: ds[long])
    assert len(target["text"]) == BIG and target["text"].startswith("the long one xx")
    assert peak < 3 * BIG, f"{peak / BIG:.1f}x the caption"


def _reference(ends, data, rows):
    """Each row's values, row by row, back to back."""
    counts = np.array([ends[r + 1] - ends[r] for r in rows], dtype=np.int64)
    return counts, [np.concatenate([d[ends[r] : ends[r + 1]] for r in rows] + [d[:0]]) for d in data]


@pytest.mark.parametrize("indexed", [0, 1 << 30])
def test_the_gather_is_exact_whichever_way_it_copies(monkeypatch, indexed):
    monkeypatch.setattr(base, "_INDEXED_GATHER", indexed)
    rng = np.random.default_rng(7)
    samples = 40
    sizes = rng.integers(0, 6, samples)
    sizes[[3, 17]] = 0
    boxes, ends = pack_ragged([rng.random((n, 4)) for n in sizes], "<f4", (4,))
    classes, _ = pack_ragged([rng.integers(0, 80, n) for n in sizes], "<i8")
    crowd, _ = pack_ragged([rng.integers(0, 2, n) for n in sizes], "|u1")
    columns = {"b": boxes, "b_off": ends, "c": classes, "k": crowd}

    def column(name, index):
        return columns[name][index]

    cases = [
        list(range(samples)),  # the whole shard: one run
        [5, 6, 7, 8, 20, 21, 3, 2, 1, 39],  # runs, a row of none, descending rows
        [9, 9, 9, 10, 11, 11],  # repeats
        [17, 3],  # only empty rows
        [],
        rng.choice(samples, 25, replace=False).tolist(),
    ]
    for rows in cases:
        counts, got = ragged_gather(column, "b", "b_off", rows, samples, extra=("c", "k"))
        want_counts, want = _reference(ends, [boxes, classes, crowd], rows)
        assert counts.tolist() == want_counts.tolist(), rows
        for g, w, source in zip(got, want, [boxes, classes, crowd]):
            assert g.dtype == source.dtype and g.shape == w.shape, rows
            assert g.tobytes() == w.tobytes(), rows
            assert not np.shares_memory(g, source)  # fresh: a caller may change it
        per_row = ragged_rows(column, "b", "b_off", rows, samples, extra=("k",))
        assert [len(b) for b, _ in per_row] == want_counts.tolist()
        for r, (b, k) in zip(rows, per_row):
            assert b.tobytes() == boxes[ends[r] : ends[r + 1]].tobytes()
            assert k.tobytes() == crowd[ends[r] : ends[r + 1]].tobytes()


def test_text_decodes_from_the_gathered_bytes_and_refuses_what_is_not_utf8():
    from cachekit import CacheError
    from cachekit.store.fields.text import TextKind

    kind = TextKind()
    good = kind.pack("t", {}, ["café", "", "naïve ✓"])
    assert kind.unpack("t", {}, lambda name, index: good[name][index], [2, 0, 1], 3) == [
        "naïve ✓",
        "café",
        "",
    ]
    bad = dict(good, t__utf8=np.concatenate([good["t__utf8"][:-1], [0xFF]]).astype(np.uint8))
    assert kind.unpack("t", {}, lambda name, index: bad[name][index], [0, 1], 3) == ["café", ""]
    with pytest.raises(CacheError, match="not UTF-8"):
        kind.unpack("t", {}, lambda name, index: bad[name][index], [2], 3)


def test_packing_keeps_each_value_exactly_in_the_stored_dtype():
    """Values are cast per sample before they are joined: an empty list (float64 to numpy) beside
    int64 ids never sends the ids through float64; the result is in the stored dtype, and a shard
    of no samples packs to no rows of the stored row shape."""
    big = 2**62 + 1  # not a float64
    values, offsets = pack_ragged([np.array([big, 7]), [], np.array([3])], "<i8")
    assert values.dtype == np.int64 and values.tolist() == [big, 7, 3]
    assert offsets.dtype == np.int64 and offsets.tolist() == [0, 2, 2, 3]
    boxes, ends = pack_ragged([np.random.default_rng(0).random((2, 4)), np.zeros((1, 4))], "<f4", (4,))
    assert boxes.dtype == np.float32 and boxes.shape == (3, 4) and ends.tolist() == [0, 2, 3]
    assert boxes.flags.c_contiguous
    none, ends = pack_ragged([], "<f4", (4,))
    assert none.dtype == np.float32 and none.shape == (0, 4) and ends.tolist() == [0]


def _shard(**cols):
    """A column reader over ``cols`` that counts the columns it is asked for."""
    asked: list[str] = []

    def column(name, index):
        asked.append(name)
        return cols[name][index]

    return column, asked


DAMAGED = {
    "offsets run down, the last one right": (dict(o=np.array([0, 3, 2, 5])), 3),
    "offsets do not start at 0": (dict(o=np.array([1, 3, 5])), 2),
    "values past the last offset": (dict(o=np.array([0, 2, 4])), 2),
    "an extra column shorter than the values": (dict(o=np.array([0, 2, 5]), e=np.arange(4)), 2),
    "offsets that are not integers": (dict(o=np.array([0.0, 2.0, 5.0])), 2),
    "one offset too few for the samples": (dict(o=np.array([0, 2, 5])), 3),
}


@pytest.mark.parametrize("case", list(DAMAGED))
@pytest.mark.parametrize("memo", [None, {}], ids=["no memo", "memo"])
def test_each_way_offsets_can_disagree_with_their_values_is_refused(case, memo):
    change, samples = DAMAGED[case]
    cols = {"v": np.arange(5, dtype=np.float32), "e": np.arange(5), **change}
    column, _ = _shard(**cols)
    for _ in range(2):  # refused again: a failed check is never remembered
        with pytest.raises(CacheError, match="'o' do not match 'v' \\(the shard is damaged\\)"):
            ragged_gather(column, "v", "o", [0], samples, extra=("e",), memo=memo)
    assert not memo


def test_unsigned_offsets_read_and_a_shard_of_no_samples_reads_nothing():
    column, _ = _shard(v=np.arange(5, dtype=np.float32), o=np.array([0, 2, 5], dtype=np.uint32))
    counts, (values,) = ragged_gather(column, "v", "o", [1, 0], 2)
    assert counts.tolist() == [3, 2] and values.tolist() == [2, 3, 4, 0, 1]
    column, _ = _shard(v=np.zeros(0, np.float32), o=np.zeros(1, np.int64))
    counts, (values,) = ragged_gather(column, "v", "o", [], 0)
    assert counts.tolist() == [] and values.shape == (0,)


def test_a_memo_keeps_each_fields_columns_apart_and_spares_later_reads():
    column, asked = _shard(
        a=np.arange(6, dtype=np.float32),
        a_off=np.array([0, 4, 6]),
        b=np.arange(100, 103, dtype=np.float32),
        b_off=np.array([0, 1, 3]),
        k=np.arange(50, 53),
    )
    memo: dict = {}
    assert [r.tolist() for (r,) in ragged_rows(column, "a", "a_off", [1, 0], 2, memo=memo)] == [
        [4, 5],
        [0, 1, 2, 3],
    ]
    assert [r.tolist() for (r,) in ragged_rows(column, "b", "b_off", [1, 0], 2, memo=memo)] == [
        [101, 102],
        [100],
    ]
    # the same values and offsets with an extra column are columns of their own
    assert [(r.tolist(), k.tolist()) for r, k in ragged_rows(column, "b", "b_off", [1], 2, ("k",), memo)] == [
        ([101, 102], [51, 52])
    ]
    read = len(asked)
    assert read == 7
    for _ in range(2):  # every later read of these rows comes from the memo
        assert [r.tolist() for (r,) in ragged_rows(column, "a", "a_off", [0], 2, memo=memo)] == [[0, 1, 2, 3]]
        assert ragged_gather(column, "b", "b_off", [0, 1], 2, memo=memo)[1][0].tolist() == [100, 101, 102]
    assert len(asked) == read


@pytest.mark.parametrize("texts", [["café", "", "naïve ✓"], []], ids=["three", "none"])
def test_text_packs_into_the_columns_it_declares_and_reads_them_once_a_shard(texts):
    from cachekit.store.fields.text import TextKind

    kind = TextKind()
    packed = kind.pack("t", {}, texts)
    declared = kind.columns("t", {})
    assert set(packed) == set(declared)
    for name, col in declared.items():  # the stored dtype, not float64 bytes of text
        assert packed[name].dtype == np.dtype(col.dtype) and packed[name].shape[1:] == col.shape, name
    assert packed["t__utf8"].tobytes() == "".join(texts).encode("utf-8")
    column, asked = _shard(**packed)
    memo: dict = {}
    rows = list(range(len(texts)))[::-1]
    for _ in range(3):
        assert kind.unpack("t", {}, column, rows, len(texts), memo) == texts[::-1]
    assert sorted(set(asked)) == ["t__offsets", "t__utf8"] and len(asked) == 2  # once, then the memo's
