"""A tar member whose size was enlarged exactly onto a later header: the members between lie inside
the bytes it claims, and a walk of the headers alone steps over them. Its blocks are looked through
for a header where they are read anyway: a target's at discovery, which lists it and reads on at the
header it found; an image's in its shard job, which skips it naming the members hidden in it (never
built). Discovery reads no image bytes."""

from __future__ import annotations

import io
import tarfile

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build
from cachekit.build.sourceoptions import SourceOptions
from cachekit.build.sources import webdataset

QUIET = {"workers": 1, "progress": False, "order": "sorted", "pipeline": "none"}
KEYS = 5


def _png(i: int) -> bytes:
    """A 20x24 image of its own colour and noise (a few blocks of PNG, not a multiple of 512)."""
    rng = np.random.default_rng(i)
    image = rng.integers(0, 40, (20, 24, 3), dtype=np.uint8) + np.uint8(40 * i % 216)
    return cv2.imencode(".png", image)[1].tobytes()


def _tar(path, extra: dict | None = None, keys: int = KEYS):
    """``keys`` samples ``k<i>.png`` + ``k<i>.cls`` (class ``i``), ``extra`` members after k0's."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(keys):
            members = [(f"k{i}.png", _png(i)), (f"k{i}.cls", str(i).encode())]
            if i == 0 and extra:
                members += list(extra.items())
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _offsets(path) -> dict:
    with tarfile.open(path) as tar:
        return {m.name: (m.offset, m.offset_data) for m in tar.getmembers()}


def _set_size(path, name: str, size: int) -> None:
    """Write ``size`` into member ``name``'s header with its checksum right, as a damaged writer would."""
    data = bytearray(path.read_bytes())
    offset = _offsets(path)[name][0]
    header = data[offset : offset + 512]
    header[124:136] = b"%011o\0" % size
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[offset : offset + 512] = header
    path.write_bytes(bytes(data))


def _pixels(i: int) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(_png(i), np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1].transpose(2, 0, 1)


def _build(path, tmp_path, keys: int = KEYS):
    return build(str(path), tmp_path / "c", BuildConfig(**QUIET), classes=[str(i) for i in range(keys)])


def test_a_target_enlarged_onto_a_later_header_is_listed_and_the_hidden_members_are_read(tmp_path):
    path = _tar(tmp_path / "t.tar")
    at = _offsets(path)
    lands = at["k3.png"][0]  # its data would end exactly at k3.png's header: k2 hidden
    _set_size(path, "k1.cls", lands - at["k1.cls"][1])
    result = _build(path, tmp_path)
    reasons = {s.path: s.reason for s in result.manifest.skipped}
    assert reasons == {
        "t.tar/k1.cls": f"its header says {lands - at['k1.cls'][1]} bytes, but the next header is at byte "
        f"{at['k2.png'][0]}: damaged, left out"
    }
    ds = CachedDataset(tmp_path / "c")
    assert len(ds) == KEYS - 1  # k0, k2, k3, k4: k2 was inside k1's claimed bytes, and is found
    for i, key in enumerate([0, 2, 3, 4]):
        image, label = ds[i]
        assert label == key and ds.source(i) == f"t.tar/k{key}.png"
        assert np.array_equal(image.numpy(), _pixels(key))


def test_a_header_in_the_last_block_of_a_claimed_size_is_found(tmp_path):
    """k0.cls made 513 bytes: its blocks end at k1.png's header, and the header of the empty k0.txt
    lies in its last block, of which the size claims one byte."""
    path = _tar(tmp_path / "t.tar", {"k0.txt": b""})
    at = _offsets(path)
    assert at["k0.txt"][0] == at["k0.cls"][1] + 512 and at["k1.png"][0] == at["k0.txt"][0] + 512
    _set_size(path, "k0.cls", 513)
    result = _build(path, tmp_path)
    assert {s.path: s.reason for s in result.manifest.skipped} == {
        "t.tar/k0.cls": f"its header says 513 bytes, but the next header is at byte {at['k0.txt'][0]}: "
        "damaged, left out"
    }
    ds = CachedDataset(tmp_path / "c")
    assert [(ds.source(i), ds[i][1]) for i in range(len(ds))] == [
        (f"t.tar/k{i}.png", i) for i in range(1, KEYS)
    ]


def test_a_member_that_holds_the_magic_but_no_header_and_an_unread_tar_member_are_kept_whole(tmp_path):
    """A caption with ``ustar`` at a header's magic offset is text, not a header (its checksum is
    wrong), and one holding a whole header off the 512-byte blocks is text too; a ``.tar`` member holds headers of its own and is never read, so nothing of it is found."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("k9.png")
        info.size = len(_png(9))
        tar.addfile(info, io.BytesIO(_png(9)))
    header = tarfile.TarInfo("k8.png").tobuf(tarfile.USTAR_FORMAT)  # a whole valid header, off the blocks
    caption = (b"x" * 257 + b"ustar\x0000" + b"y" * 250) * 2 + b"z" * 100 + header  # magic at 257 and 769
    path = _tar(tmp_path / "t.tar", {"k0.txt": caption, "k0.tar": inner.getvalue()})
    result = _build(path, tmp_path)
    assert result.manifest.skipped == ()
    ds = CachedDataset(tmp_path / "c")
    assert [ds.source(i) for i in range(len(ds))] == [f"t.tar/k{i}.png" for i in range(KEYS)]
    assert ds[0][1]["text"] == caption.decode("latin-1")
    assert [ds[i][1]["label"] for i in range(KEYS)] == list(range(KEYS))


def test_an_image_enlarged_onto_a_later_header_is_skipped_by_its_job_naming_the_hidden_members(tmp_path):
    """k1.png's size runs exactly onto k3.png's header: discovery steps over k1.cls and k2 (it reads
    no image bytes); the job reading k1.png finds their headers in its bytes and names them."""
    path = _tar(tmp_path / "t.tar")
    at = _offsets(path)
    claimed = at["k3.png"][0] - at["k1.png"][1]
    _set_size(path, "k1.png", claimed)
    result = _build(path, tmp_path)
    assert {s.path: s.reason for s in result.manifest.skipped} == {
        "t.tar/k1.png": f"its header says {claimed} bytes, which run over the tar headers of k1.cls, "
        "k2.png, k2.cls: damaged; it and the 3 members hidden in it are not built"
    }
    ds = CachedDataset(tmp_path / "c")
    assert [ds.source(i) for i in range(len(ds))] == ["t.tar/k0.png", "t.tar/k3.png", "t.tar/k4.png"]
    for i, key in enumerate([0, 3, 4]):
        image, label = ds[i]
        assert label == key and np.array_equal(image.numpy(), _pixels(key))


def test_a_header_in_the_last_block_of_an_image_is_found_by_its_job(tmp_path):
    """k0.png made one byte longer than its blocks: its last block, of which it claims one byte, is
    the header of the empty k0.txt, and the walk steps onto k1.png's header right after it."""
    path = _tar(tmp_path / "t.tar", {"k0.txt": b""})
    at = _offsets(path)
    start = at["k0.png"][1]
    assert at["k0.cls"][0] - start == -(-len(_png(0)) // 512) * 512
    path_bytes = path.read_bytes()  # k0.cls moved after k0.txt, so k0.txt's header ends k0.png's blocks
    cls_block, txt_block = path_bytes[at["k0.cls"][0] : at["k0.txt"][0]], path_bytes[at["k0.txt"][0] : at["k1.png"][0]]
    path.write_bytes(path_bytes[: at["k0.cls"][0]] + txt_block + cls_block + path_bytes[at["k1.png"][0] :])
    _set_size(path, "k0.png", at["k0.cls"][0] - start + 1)
    result = _build(path, tmp_path)
    assert {s.path: s.reason for s in result.manifest.skipped} == {
        "t.tar/k0.png": f"its header says {at['k0.cls'][0] - start + 1} bytes, which run over the tar "
        "headers of k0.txt: damaged; it and the 1 member hidden in it are not built"
    }
    ds = CachedDataset(tmp_path / "c")
    assert [(ds.source(i), ds[i][1]) for i in range(len(ds))] == [(f"t.tar/k{i}.png", i) for i in range(1, KEYS)]


def test_the_hidden_members_are_named_header_to_header_at_most_eight(tmp_path):
    """k0.png run onto k4.png's header hides nine members, a .tar among them: named header to
    header by their sizes (the inner tar's own k9.png is not one of them), eight and a count."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("k9.png")
        info.size = len(_png(9))
        tar.addfile(info, io.BytesIO(_png(9)))
    path = _tar(tmp_path / "t.tar", {"k0.tar": inner.getvalue(), "k0.txt": b"hi"}, keys=6)
    at = _offsets(path)
    claimed = at["k4.png"][0] - at["k0.png"][1]
    _set_size(path, "k0.png", claimed)
    result = _build(path, tmp_path, keys=6)
    assert {s.path: s.reason for s in result.manifest.skipped} == {
        "t.tar/k0.png": f"its header says {claimed} bytes, which run over the tar headers of k0.cls, "
        "k0.tar, k0.txt, k1.png, k1.cls, k2.png, k2.cls, k3.png and 1 more: damaged; it and the 9 "
        "members hidden in it are not built"
    }
    ds = CachedDataset(tmp_path / "c")
    assert [ds.source(i) for i in range(len(ds))] == ["t.tar/k4.png", "t.tar/k5.png"]


def test_hidden_members_are_named_by_their_long_names():
    """A PAX path and a GNU long name (past the header's 100 bytes) name the member after them."""
    long_name = "d/" + "x" * 120 + ".png"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        out = io.BytesIO()
        pax = {"comment": "a global header"} if fmt == tarfile.PAX_FORMAT else None  # names no member
        with tarfile.open(fileobj=out, mode="w", format=fmt, pax_headers=pax) as tar:
            for name in ("a.png", long_name, "b.cls"):
                info = tarfile.TarInfo(name)
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
        not_a_header = (b"\0" * 257 + b"ustar\x0000").ljust(512, b"\0")  # the magic, and no checksum
        found = webdataset.hidden_members(not_a_header + b"\0" * 512 + out.getvalue())
        assert found == ["a.png", long_name, "b.cls"]
    assert webdataset.hidden_members(_png(1) + b"\0" * 512) == []


@pytest.mark.parametrize("cls", [b"x", b"1" * ((1 << 20) + 1)])
def test_an_image_of_a_key_left_out_at_discovery_names_the_members_it_hides(tmp_path, cls):
    """No job reads the image of a key left out (its .cls is not a class, or over the size a target
    may have), so discovery looks through its blocks: the k9.txt hidden in k9.png is named."""
    path = _tar(tmp_path / "t.tar", {"k9.cls": cls, "k9.png": _png(9), "k9.txt": b"hi"})
    at = _offsets(path)
    claimed = at["k1.png"][0] - at["k9.png"][1]
    _set_size(path, "k9.png", claimed)
    result = _build(path, tmp_path)
    hidden = (
        f"its header says {claimed} bytes, which run over the tar headers of k9.txt: damaged; it and "
        "the 1 member hidden in it are not built"
    )
    assert [(s.path, s.reason) for s in result.manifest.skipped] == (
        [("t.tar/k9.png", f"its .cls 'x' is not an integer class; {hidden}")]
        if cls == b"x"
        else [("t.tar/k9.cls", f"{len(cls)} bytes, over the {1 << 20} a .cls member may have"), ("t.tar/k9.png", hidden)]
    )
    assert len(CachedDataset(tmp_path / "c")) == KEYS


def test_a_target_over_its_limit_run_onto_a_later_header_is_looked_through_at_discovery(tmp_path):
    """k0.cls run onto k2.png's header claims over 1 MiB: left out for that, and looked through
    (damaged input only), so k1, hidden in it behind a big .npy, is found and built."""
    path = _tar(tmp_path / "t.tar", {"k0.npy": bytes(1 << 20)})
    at = _offsets(path)
    claimed = at["k2.png"][0] - at["k0.cls"][1]
    _set_size(path, "k0.cls", claimed)
    result = _build(path, tmp_path)
    assert [(s.path, s.reason) for s in result.manifest.skipped] == [
        ("t.tar/k0.cls", f"{claimed} bytes, over the {1 << 20} a .cls member may have")
    ]
    ds = CachedDataset(tmp_path / "c")
    assert [(ds.source(i), ds[i][1]) for i in range(len(ds))] == [(f"t.tar/k{i}.png", i) for i in range(1, KEYS)]


def test_a_second_image_of_a_key_is_looked_through_at_discovery(tmp_path):
    """k0.jpg, a second image of k0 that no job reads, run onto k1.png's header: discovery finds
    the k0.txt hidden in it and reads on there; k0 is left out whole (which image is it?)."""
    path = _tar(tmp_path / "t.tar", {"k0.jpg": _png(7), "k0.txt": b"hi"})
    at = _offsets(path)
    claimed = at["k1.png"][0] - at["k0.jpg"][1]
    _set_size(path, "k0.jpg", claimed)
    result = _build(path, tmp_path)
    assert [(s.path, s.reason) for s in result.manifest.skipped] == [
        ("t.tar/k0.jpg", "a second image for the key 'k0', left out"),
        ("t.tar/k0.jpg", f"its header says {claimed} bytes, but the next header is at byte {at['k0.txt'][0]}: damaged, left out"),
    ]
    ds = CachedDataset(tmp_path / "c")
    assert [ds.source(i) for i in range(len(ds))] == [f"t.tar/k{i}.png" for i in range(1, KEYS)]


def test_discovery_reads_the_headers_and_targets_but_no_image_bytes(tmp_path, monkeypatch):
    """The images of a tar of big images are never read at discovery (their jobs read them once)."""
    path = tmp_path / "t.tar"
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(4):
            for name, data in ((f"k{i}.png", rng.bytes(200_000)), (f"k{i}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    read = []
    opened = webdataset.open_file

    class Counted(io.BufferedReader):
        def read(self, size=-1):
            data = super().read(size)
            read.append(len(data))
            return data

    def counting(where, url, storage_options):
        return Counted(opened(where, url, storage_options).detach())

    monkeypatch.setattr(webdataset, "open_file", counting)
    source = webdataset.tar_source(str(path), SourceOptions())
    assert list(source.paths) == [f"t.tar/k{i}.png" for i in range(4)]
    assert 0 < sum(read) < 4 * 512 * 4 + 4 * 1024  # headers and the .cls blocks, not 800 kB of images
    job_read = source.reader.open(None, 0)  # a job reads each image's blocks, and gives its bytes
    with tarfile.open(path) as tar:
        for rel, target in zip(source.paths, source.targets):
            assert job_read(rel, target) == tar.extractfile(rel.split("/", 1)[1]).read()


def test_strict_fails_the_build_naming_the_members_an_image_hides(tmp_path):
    """A skip like any other: --strict makes it the build's error (exit 1), with the names."""
    from cachekit.errors import BuildError

    path = _tar(tmp_path / "t.tar")
    at = _offsets(path)
    _set_size(path, "k1.png", at["k3.png"][0] - at["k1.png"][1])
    config = BuildConfig(**QUIET, strict=True)
    with pytest.raises(BuildError, match=r"t\.tar/k1\.png: .* tar headers of k1\.cls, k2\.png, k2\.cls") as err:
        build(str(path), tmp_path / "c", config, classes=[str(i) for i in range(KEYS)])
    assert err.value.exit_code == 1
