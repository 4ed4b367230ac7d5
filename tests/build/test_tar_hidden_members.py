"""A tar member whose size was enlarged exactly onto a later header: the members between lie inside
the bytes it claims, and a walk of the headers alone steps over them. Discovery scans an image's or
a target's blocks for a header, lists the damaged member and reads on at the header it found."""

from __future__ import annotations

import io
import tarfile

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build

QUIET = {"workers": 1, "progress": False, "order": "sorted", "pipeline": "none"}
KEYS = 5


def _png(i: int) -> bytes:
    """A 20x24 image of its own colour and noise (a few blocks of PNG, not a multiple of 512)."""
    rng = np.random.default_rng(i)
    image = rng.integers(0, 40, (20, 24, 3), dtype=np.uint8) + np.uint8(40 * i % 216)
    return cv2.imencode(".png", image)[1].tobytes()


def _tar(path, extra: dict | None = None):
    """``KEYS`` samples ``k<i>.png`` + ``k<i>.cls`` (class ``i``), ``extra`` members after k0's."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(KEYS):
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


@pytest.mark.parametrize("damaged", ["k1.png", "k1.cls"])
def test_a_size_enlarged_onto_a_later_header_lists_the_member_and_reads_the_hidden_ones(tmp_path, damaged):
    path = _tar(tmp_path / "t.tar")
    at = _offsets(path)
    lands = at["k3.png"][0]  # its data would end exactly at k3.png's header: k1's rest and k2 hidden
    _set_size(path, damaged, lands - at[damaged][1])
    hidden = at["k1.cls" if damaged == "k1.png" else "k2.png"][0]  # the first header inside its blocks
    result = build(str(path), tmp_path / "c", BuildConfig(**QUIET), classes=[str(i) for i in range(KEYS)])
    reasons = {s.path: s.reason for s in result.manifest.skipped}
    assert reasons == {
        f"t.tar/{damaged}": f"its header says {lands - at[damaged][1]} bytes, but the next header is at byte "
        f"{hidden}: damaged, left out"
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
    result = build(str(path), tmp_path / "c", BuildConfig(**QUIET), classes=[str(i) for i in range(KEYS)])
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
    result = build(str(path), tmp_path / "c", BuildConfig(**QUIET), classes=[str(i) for i in range(KEYS)])
    assert result.manifest.skipped == ()
    ds = CachedDataset(tmp_path / "c")
    assert [ds.source(i) for i in range(len(ds))] == [f"t.tar/k{i}.png" for i in range(KEYS)]
    assert ds[0][1]["text"] == caption.decode("latin-1")
    assert [ds[i][1]["label"] for i in range(KEYS)] == list(range(KEYS))
