"""The chain of a tar's headers, each header's size leading to the next: where it ends. A header that
does not read (a bad checksum, a negative size, a PAX size that is no number or that its header
does not state) is listed with its offset and ends the walk, with the key before it; nothing after
it is read, so nothing is made of a member's bytes (GNU tar scans on and lists them, tarfile stops
without a word). Data after the end-of-archive block is listed, not read; long names still read."""

from __future__ import annotations

import io
import tarfile
import threading

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build
from cachekit.build.sources import webdataset
from cachekit.build.sources.sourceoptions import SourceOptions
from cachekit.errors import BuildError

QUIET = {"workers": 1, "progress": False, "order": "sorted", "pipeline": "none"}


def _png(i: int) -> bytes:
    return cv2.imencode(".png", np.full((8, 8, 3), 30 * i, np.uint8))[1].tobytes()


def _forged() -> bytes:
    """A whole tar of ``evil.png`` (an image) and ``evil.cls`` (class 2), end blocks included."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("evil.png", _png(7)), ("evil.cls", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _members(keys: int, caption: int | None = None) -> list[tuple[str, bytes]]:
    """``k<i>.png`` + ``k<i>.cls`` (class ``i``); key ``caption`` has a ``.txt`` holding a whole tar."""
    members = []
    for i in range(keys):
        members += [(f"k{i}.png", _png(i)), (f"k{i}.cls", str(i).encode())]
        if i == caption:
            members.append((f"k{i}.txt", b"c" * 512 + _forged()))
    return members


def _write(path, members, fmt=tarfile.USTAR_FORMAT, pax: dict | None = None) -> dict:
    """The tar of ``members`` (``pax``: per-member PAX records by name); each member's header offset."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.pax_headers = dict((pax or {}).get(name, {}))
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return {m.name: m.offset for m in tar.getmembers()}


def _damage(path, at: int, size: int | None = None) -> None:
    """The header at byte ``at`` given a wrong checksum, or ``size`` with its checksum right."""
    data = bytearray(path.read_bytes())
    header = data[at : at + 512]
    if size is None:
        header[148:156] = b"0000000\0"
    else:
        header[124:136] = tarfile.itn(size, 12, tarfile.GNU_FORMAT)
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
    data[at : at + 512] = header
    path.write_bytes(bytes(data))


def _names(path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


def _built(path, tmp_path, **options):
    result = build(str(path), tmp_path / "c", BuildConfig(**QUIET, **options), classes=["0", "1", "2", "3"])
    ds = CachedDataset(tmp_path / "c")
    return [(s.path, s.reason) for s in result.manifest.skipped], [
        (ds.source(i), ds[i][1]) for i in range(len(ds))
    ]


def _damaged(at: int, size: int, why: str) -> str:
    return (
        f"a damaged header at byte {at} ({why}): the {size - at} bytes from there on are not read "
        "(where its member ends is not known)"
    )


def test_a_damaged_header_ends_the_walk_with_the_key_read_before_it(tmp_path):
    """k2.png's header has a bad checksum: it is listed with its offset; k1, whose members may go on
    past it, is left out with it; k0 is built; nothing after it is read (tarfile stops there too)."""
    path = tmp_path / "t.tar"
    at = _write(path, _members(4))["k2.png"]
    _damage(path, at)
    size = path.stat().st_size
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        ("t.tar", _damaged(at, size, "bad checksum")),
        ("t.tar/k1", f"its members may go on past the damaged header at byte {at}, left out"),
    ]
    assert built == [("t.tar/k0.png", 0)]
    assert _names(path) == ["k0.png", "k0.cls", "k1.png", "k1.cls"]


def test_a_damaged_header_before_a_caption_holding_a_tar_invents_nothing(tmp_path):
    """k1.txt's header has a bad checksum and its caption holds a whole tar: where k1.txt ends is not
    known, so nothing after it is read; a scan on for the next header-like block (GNU tar's) would
    list evil.png and evil.cls."""
    path = tmp_path / "t.tar"
    at = _write(path, _members(3, caption=1))["k1.txt"]
    _damage(path, at)
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        ("t.tar", _damaged(at, path.stat().st_size, "bad checksum")),
        ("t.tar/k1", f"its members may go on past the damaged header at byte {at}, left out"),
    ]
    assert built == [("t.tar/k0.png", 0)]


def test_a_size_that_ends_inside_a_members_bytes_is_a_damaged_header_there(tmp_path):
    """k1.txt's size (its checksum right) made two blocks short of its four: the next header would be
    its third block of dots, which does not read as one: listed as a damaged header there."""
    path = tmp_path / "t.tar"
    members = [
        *_members(2),
        ("k1.txt", b"a caption".ljust(2000, b".")),
        ("k2.png", _png(2)),
        ("k2.cls", b"2"),
    ]
    at = _write(path, members)["k1.txt"]
    _damage(path, at, size=1500 - 512)  # its data: four blocks, said to be two
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        ("t.tar", _damaged(at + 512 + 1024, path.stat().st_size, "invalid header")),
        ("t.tar/k1", f"its members may go on past the damaged header at byte {at + 1536}, left out"),
    ]
    assert built == [("t.tar/k0.png", 0)]


def test_a_member_of_any_kind_run_past_the_end_ends_the_walk_with_its_key(tmp_path):
    """k1.npy (never read) said to be 10**9 bytes: k1.cls and k2 would lie inside it, so the walk
    ends there, listed, and k1 (whose members may go on inside it) is left out; tarfile raises."""
    path = tmp_path / "t.tar"
    members = [*_members(1), ("k1.png", _png(1)), ("k1.npy", bytes(8)), ("k1.cls", b"1"), *_members(3)[4:]]
    at = _write(path, members)["k1.npy"]
    _damage(path, at, size=10**9)
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        (
            "t.tar",
            f"'k1.npy', whose header at byte {at} says 1000000000 bytes, runs past the end (cut short, or its "
            "size damaged): nothing after it is read",
        ),
        ("t.tar/k1", "its members may go on inside 'k1.npy', left out"),
    ]
    assert built == [("t.tar/k0.png", 0)]
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        _names(path)


def test_a_sparse_member_is_left_out_and_the_walk_goes_on_past_its_blocks(tmp_path):
    """An old GNU sparse k1.png: its header's size is its stored bytes (the chain goes on past them),
    its map says a hole of 4096 bytes follows, so its bytes are not one run at its offset."""
    path = tmp_path / "t.tar"
    at = _write(path, _members(3))["k1.png"]
    data = bytearray(path.read_bytes())
    header = data[at : at + 512]
    stored = len(_png(1))
    header[156:157] = tarfile.GNUTYPE_SPARSE
    header[386:410] = b"%011o\0%011o\0" % (0, stored)  # one piece: its bytes at 0
    header[483:495] = b"%011o\0" % (stored + 4096)  # the real size: a hole after them
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[at : at + 512] = header
    path.write_bytes(bytes(data))
    with tarfile.open(path) as tar:
        assert tar.getmember("k1.png").issparse() and tar.getnames()[-2:] == ["k2.png", "k2.cls"]
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        ("t.tar/k1.png", "a sparse member, left out"),
        ("t.tar/k1", "no image (jpg, jpeg, png, webp)"),
    ]
    assert built == [("t.tar/k0.png", 0), ("t.tar/k2.png", 2)]


def test_a_folder_whose_header_states_a_size_has_no_bytes_and_the_walk_goes_on(tmp_path):
    """A folder's header saying 10**9 bytes: no bytes follow a folder's header (POSIX; GNU tar and
    tarfile read the next header right after it), so it claims nothing and the walk goes on."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in [*_members(1), ("d", None), *_members(2)[2:]]:
            info = tarfile.TarInfo(name)
            info.type, info.size = (tarfile.DIRTYPE, 0) if data is None else (tarfile.REGTYPE, len(data))
            tar.addfile(info, None if data is None else io.BytesIO(data))
    with tarfile.open(path) as tar:
        at = tar.getmember("d").offset
    _damage(path, at, size=10**9)
    assert _names(path) == ["k0.png", "k0.cls", "d", "k1.png", "k1.cls"]
    skipped, built = _built(path, tmp_path)
    assert skipped == [] and built == [("t.tar/k0.png", 0), ("t.tar/k1.png", 1)]


def test_a_negative_size_ends_the_walk_instead_of_walking_back_forever(tmp_path):
    """A size of -512 (GNU base-256) would put the next header on its own: tarfile reads it again
    forever. The walk ends there, listed."""
    path = tmp_path / "t.tar"
    at = _write(path, _members(3))["k2.png"]
    _damage(path, at, size=-512)
    found = []
    walk = threading.Thread(
        target=lambda: found.append(webdataset.tar_source(str(path), SourceOptions())), daemon=True
    )
    walk.start()
    walk.join(120)  # a bound on a hang, not a timing: the walk reads a few blocks
    assert not walk.is_alive() and len(found) == 1
    assert list(found[0].paths) == ["t.tar/k0.png"]
    assert found[0].ignored == (
        ("t.tar", _damaged(at, path.stat().st_size, "a negative size (-512)")),
        ("t.tar/k1", f"its members may go on past the damaged header at byte {at}, left out"),
    )


def test_a_pax_size_that_is_no_number_ends_the_walk(tmp_path):
    """tarfile reads the PAX size '12x' of k1.txt as 0, so its caption's first bytes would be the
    next header (it lists evil.png); GNU tar calls the record malformed. The walk ends at it."""
    path = tmp_path / "t.tar"
    caption = _forged() + b"more"
    members = [*_members(2), ("k1.txt", caption), ("k2.png", _png(2)), ("k2.cls", b"2")]
    at = _write(path, members, tarfile.PAX_FORMAT, pax={"k1.txt": {"size": "12x"}})["k1.txt"]
    assert "evil.png" in _names(path)
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        ("t.tar", _damaged(at, path.stat().st_size, "a PAX size '12x' that is no number")),
        ("t.tar/k1", f"its members may go on past the damaged header at byte {at}, left out"),
    ]
    assert built == [("t.tar/k0.png", 0)]


def test_a_global_pax_size_its_header_does_not_state_ends_the_walk(tmp_path):
    """A global PAX record ``size=9`` before k2.png: tarfile gives it 9 bytes but puts the next header
    where its own header's size leads; its bytes would be read short of that (a .cls, past its own)."""
    path = tmp_path / "t.tar"
    first = io.BytesIO()
    with tarfile.open(fileobj=first, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in _members(2):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        start = tar.offset  # where its end blocks begin
    noise = cv2.imencode(".png", np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8))[1]
    rest = io.BytesIO()
    with tarfile.open(fileobj=rest, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"size": "9"}) as tar:
        for name, data in (("k2.png", noise.tobytes()), ("k2.cls", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(first.getvalue()[:start] + rest.getvalue())
    with tarfile.open(path) as tar:
        at = tar.getmember("k2.png").offset
    assert len(noise) > 512  # its blocks are not those of 9 bytes
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        (
            "t.tar",
            _damaged(at, path.stat().st_size, "a size of 9 bytes that is not the one its header states"),
        ),
        ("t.tar/k1", f"its members may go on past the damaged header at byte {at}, left out"),
    ]
    assert built == [("t.tar/k0.png", 0)]


def test_data_after_the_end_of_archive_block_is_listed_not_read(tmp_path):
    """Two tars joined by cat: the first's members are built and the second is listed by where its
    data starts, as tar and tarfile stop at the first end-of-archive block; zeros after it are the
    tar's padding and list nothing."""
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    _write(first, _members(2))
    _write(second, [("k3.png", _png(3)), ("k3.cls", b"3")])
    with tarfile.open(first) as tar:
        tar.getmembers()
        end = tar.offset
    path = tmp_path / "t.tar"
    path.write_bytes(first.read_bytes() + second.read_bytes())
    skipped, built = _built(path, tmp_path)
    assert skipped == [
        (
            "t.tar",
            f"data at byte {first.stat().st_size}, after its end-of-archive block at byte {end}, is not "
            "read (tar reads no further; two tars joined by cat?)",
        )
    ]
    assert built == [("t.tar/k0.png", 0), ("t.tar/k1.png", 1)] and _names(path) == [
        "k0.png",
        "k0.cls",
        "k1.png",
        "k1.cls",
    ]
    path.write_bytes(first.read_bytes() + bytes(5000))
    skipped, built = _built(path, tmp_path, overwrite=True)
    assert skipped == [] and built == [("t.tar/k0.png", 0), ("t.tar/k1.png", 1)]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names_are_read_on_the_chain(tmp_path, fmt):
    """A GNU long name and a PAX path (past the header's 100 bytes, and not ASCII) are headers of
    the chain: the member after them is named by them and the walk goes on past their blocks."""
    folder = "d/" + "x" * 120 + "/é"
    path = tmp_path / "t.tar"
    _write(
        path,
        [
            (f"{folder}/k{i}{ext}", data)
            for i in range(3)
            for ext, data in ((".png", _png(i)), (".cls", b"%d" % i))
        ],
        fmt,
    )
    skipped, built = _built(path, tmp_path)
    assert skipped == [] and built == [(f"t.tar/{folder}/k{i}.png", i) for i in range(3)]


def test_strict_fails_the_build_on_a_damaged_header(tmp_path):
    """A skip like any other: --strict makes it the build's error (exit 1), naming where."""
    path = tmp_path / "t.tar"
    at = _write(path, _members(3))["k2.png"]
    _damage(path, at)
    with pytest.raises(BuildError, match=rf"t\.tar: a damaged header at byte {at} \(bad checksum\)") as err:
        build(str(path), tmp_path / "c", BuildConfig(**QUIET, strict=True), classes=["0", "1", "2"])
    assert err.value.exit_code == 1


def test_a_jobs_read_of_a_tar_cut_after_discovery_says_what_it_asked_and_got(tmp_path):
    path = tmp_path / "t.tar"
    _write(path, _members(2))
    source = webdataset.tar_source(str(path), SourceOptions())
    f, offset, size = source.targets[1]["at"]
    path.write_bytes(path.read_bytes()[: offset + size - 1])
    read = source.reader.open(None, 0)
    with pytest.raises(OSError, match=rf"^{size} bytes at {offset} asked, {size - 1} read: the file was cut"):
        read(source.paths[1], source.targets[1])


def test_tars_on_object_storage_are_walked_as_local_ones(tmp_path, s3_options):
    """The same walk reads a tar through an fsspec file: a caption holding a tar is a caption, a
    damaged header ends the walk, and data after the end-of-archive block is listed, as locally."""
    s3fs = pytest.importorskip("s3fs")
    folder = tmp_path / "tars"
    folder.mkdir()
    _write(folder / "a.tar", _members(3, caption=1))
    at = _write(folder / "b.tar", _members(4, caption=2))["k2.txt"]
    _damage(folder / "b.tar", at)
    (folder / "c.tar").write_bytes((folder / "a.tar").read_bytes() * 2)
    fs = s3fs.S3FileSystem(**s3_options)
    fs.mkdir("raw-tars")
    fs.put(str(folder) + "/", "raw-tars/", recursive=True)
    found = {}
    for where, options in ((str(folder), None), ("s3://raw-tars", s3_options)):
        source = webdataset.tar_source(f"{where}/{{a,b,c}}.tar", SourceOptions(), options)
        found[where] = (list(source.paths), source.ignored)
    assert found[str(folder)] == found["s3://raw-tars"]
    paths, ignored = found["s3://raw-tars"]
    assert paths == [
        "a.tar/k0.png",
        "a.tar/k2.png",
        "b.tar/k0.png",
        "b.tar/k1.png",
        "c.tar/k0.png",
        "c.tar/k2.png",
    ]
    assert ignored[:3] == (  # k1's caption holds a PNG: not UTF-8 text, and nothing else
        ("a.tar/k1.png", "its .txt is not UTF-8 text"),
        ("b.tar", _damaged(at, (folder / "b.tar").stat().st_size, "bad checksum")),
        ("b.tar/k2", f"its members may go on past the damaged header at byte {at}, left out"),
    )
    assert [where for where, _ in ignored[3:]] == ["c.tar", "c.tar/k1.png"]
    assert ignored[3][1].startswith(
        f"data at byte {(folder / 'a.tar').stat().st_size}, after its end-of-archive"
    )
