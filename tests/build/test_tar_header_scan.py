"""The tar header scan in process: names that are not UTF-8, a PAX header that names no path, and the
reason that names the members hidden in a member's blocks."""

from __future__ import annotations

import io
import tarfile

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build
from cachekit.build.sources import webdataset
from cachekit.image.ops import DecodeError


def _tar(names, fmt, pax: dict | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 3
            if pax:
                info.pax_headers = dict(pax)
            tar.addfile(info, io.BytesIO(b"abc"))
    return out.getvalue()


def test_hidden_names_that_are_not_utf8_are_read_as_their_bytes():
    odd = "k\udcff.png"  # the byte 0xff, as tarfile reads it back with surrogateescape
    long_odd = "d/" + "\udcfe" * 120 + ".png"  # a GNU long name of such bytes
    data = b"\0" * 512 + _tar(["a.png", odd], tarfile.USTAR_FORMAT) + _tar([long_odd], tarfile.GNU_FORMAT)
    data += _tar([long_odd.replace("d/", "p/")], tarfile.PAX_FORMAT)  # a PAX path of such bytes
    assert webdataset.hidden_members(data) == ["a.png", odd, long_odd, long_odd.replace("d/", "p/")]


def test_a_pax_header_without_a_path_leaves_the_members_own_name():
    data = b"\0" * 512 + _tar(["a.png", "b.cls"], tarfile.PAX_FORMAT, pax={"comment": "no path here"})
    assert webdataset.hidden_members(data) == ["a.png", "b.cls"]


def test_the_reason_names_eight_members_and_counts_the_rest():
    names = [f"k{i}.png" for i in range(9)]
    assert webdataset.hidden_reason(5000, names) == (
        "its header says 5000 bytes, which run over the tar headers of k0.png, k1.png, k2.png, k3.png, "
        "k4.png, k5.png, k6.png, k7.png and 1 more: damaged; it and the 9 members hidden in it are not built"
    )
    assert webdataset.hidden_reason(700, names[:8]).startswith(
        "its header says 700 bytes, which run over the tar headers of k0.png, k1.png, k2.png, k3.png, "
        "k4.png, k5.png, k6.png, k7.png: damaged; it and the 8 members"
    )
    assert webdataset.hidden_reason(600, ["a.cls"]).endswith(
        "of a.cls: damaged; it and the 1 member hidden in it are not built"
    )


def test_a_shard_jobs_read_of_a_member_run_over_later_headers_is_refused_naming_them(tmp_path):
    path = tmp_path / "t.tar"
    path.write_bytes(_tar(["a.png", "b.cls", "c.png"], tarfile.USTAR_FORMAT))
    with tarfile.open(path) as tar:
        at = {m.name: (m.offset, m.offset_data) for m in tar.getmembers()}
    read = webdataset.TarReader((str(path),), False).open(None, 0)
    assert read("t.tar/c.png", {"at": (0, at["c.png"][1], 3)}) == b"abc"  # intact: its own bytes
    claimed = at["c.png"][1] + 3 - at["a.png"][1]
    with pytest.raises(DecodeError) as info:
        read("t.tar/a.png", {"at": (0, at["a.png"][1], claimed)})
    assert str(info.value) == webdataset.hidden_reason(claimed, ["b.cls", "c.png"])
    assert f"says {claimed} bytes" in str(info.value) and "the 2 members hidden" in str(info.value)


def test_the_next_header_is_looked_for_up_to_the_end_given_and_no_further(tmp_path):
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, size in (("a.png", 2000), ("b.cls", 3)):  # a.png's data: four blocks
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"u" * size))  # a "u" at every magic's place, and no header
    with tarfile.open(path) as tar:
        b = {m.name: m.offset for m in tar.getmembers()}["b.cls"]
    assert b == 2560
    with path.open("rb") as fh:
        assert webdataset._next_header(fh, 513, b + 512) == b  # from the block after a.png's header
        assert webdataset._next_header(fh, 513, b) is None  # b.cls's header lies at the end given
        assert webdataset._next_header(fh, 513, b - 1) is None
        assert webdataset._next_header(fh, b + 1, path.stat().st_size) is None  # none after it


def test_a_read_past_the_end_of_the_file_says_what_it_asked_and_got(tmp_path):
    path = tmp_path / "t.tar"
    path.write_bytes(b"x" * 700)
    with (
        path.open("rb") as fh,
        pytest.raises(OSError, match="^800 bytes at 0 asked, 700 read: the file was cut"),
    ):
        webdataset._read_blocks(fh, 0, 800)


def _three_keys(path, damage):
    """k0, k1, k2 (.png + .cls) with ``damage(header)`` done to k1.png's header."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(3):
            png = cv2.imencode(".png", np.full((8, 8, 3), 30 * i, np.uint8))[1].tobytes()
            for name, data in ((f"k{i}.png", png), (f"k{i}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        at = {m.name: m.offset for m in tar.getmembers()}
    data = bytearray(path.read_bytes())
    header = data[at["k1.png"] : at["k1.png"] + 512]
    damage(header)
    data[at["k1.png"] : at["k1.png"] + 512] = header
    path.write_bytes(bytes(data))
    return at


def _bad_checksum(header):
    header[148:156] = b"0000000\0"


def test_a_damaged_header_leaves_its_member_out_and_the_walk_reads_on_at_the_next_one(tmp_path):
    path = tmp_path / "t.tar"
    at = _three_keys(path, _bad_checksum)
    config = BuildConfig(workers=1, progress=False, order="sorted", pipeline="none")
    result = build(str(path), path.parent / "c", config, classes=["0", "1", "2"])
    skipped = {s.path: s.reason for s in result.manifest.skipped}
    assert skipped["t.tar"] == f"a damaged header at byte {at['k1.png']}: read on at byte {at['k1.cls']}"
    assert skipped["t.tar/k1"] == "no image (jpg, jpeg, png, webp)"
    ds = CachedDataset(path.parent / "c")
    assert [ds.source(i) for i in range(len(ds))] == ["t.tar/k0.png", "t.tar/k2.png"]
