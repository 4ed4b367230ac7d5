"""A member's bytes are its own: a caption or an image that holds a whole tar (a valid header at a
512-byte boundary naming ``evil.jpg``, its image, an ``evil.cls`` of class 2) is built as what it is,
and nothing is made of the bytes inside it; discovery follows the chain of headers, as GNU tar and
``tarfile`` list the members, and reads no image bytes."""

from __future__ import annotations

import io
import tarfile

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build
from cachekit.build.sources import webdataset
from cachekit.build.sources.sourceoptions import SourceOptions

QUIET = {"workers": 1, "progress": False, "order": "sorted", "pipeline": "none"}
KEYS = 5


def _png(i: int) -> bytes:
    """A 20x24 image of its own colour and noise (a few blocks of PNG, not a multiple of 512)."""
    rng = np.random.default_rng(i)
    image = rng.integers(0, 40, (20, 24, 3), dtype=np.uint8) + np.uint8(40 * i % 216)
    return cv2.imencode(".png", image)[1].tobytes()


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(100 + i)
    return cv2.imencode(".jpg", rng.integers(0, 255, (16, 24, 3), dtype=np.uint8))[1].tobytes()


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def _forged(image: bytes) -> bytes:
    """A whole tar: ``evil.jpg`` holding ``image`` and ``evil.cls`` of class 2, then its end blocks."""
    out = b""
    for name, data in (("evil.jpg", image), ("evil.cls", b"2")):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        out += info.tobuf(tarfile.USTAR_FORMAT) + _padded(data)
    return out + b"\0" * 1024


def _bmp() -> bytes:
    """A 4x4 BMP whose every byte is below 0x80: valid UTF-8, so a caption may hold it."""
    data = cv2.imencode(".bmp", np.full((4, 4, 3), 0x21, np.uint8))[1].tobytes()
    assert max(data) < 0x80
    return data


def _tar(path, extra: dict | None = None, keys: int = KEYS, images: dict | None = None):
    """``keys`` samples ``k<i>.png`` + ``k<i>.cls`` (class ``i``), ``extra`` members after k0's;
    ``images`` replaces a key's image by name."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(keys):
            image = (images or {}).get(i, (f"k{i}.png", _png(i)))
            members = [image, (f"k{i}.cls", str(i).encode())]
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


def _tarfile_images(path) -> list[str]:
    """The image members ``tarfile`` lists, as a build names its samples."""
    with tarfile.open(path) as tar:
        names = [m.name for m in tar.getmembers() if m.name.rsplit(".", 1)[-1] in webdataset.IMAGE_KEYS]
    return [f"{path.name}/{name}" for name in names]


def _member_bytes(path, name: str) -> bytes:
    with tarfile.open(path) as tar:
        return tar.extractfile(name).read()


def _pixels(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1].transpose(2, 0, 1)


def _build(path, tmp_path, keys: int = KEYS):
    return build(str(path), tmp_path / "c", BuildConfig(**QUIET), classes=[str(i) for i in range(keys)])


@pytest.mark.parametrize("lead", [0, 512, 1536], ids=["first-block", "second-block", "fourth-block"])
def test_a_caption_holding_a_tar_is_a_caption_and_nothing_is_made_of_its_bytes(tmp_path, lead):
    """The caption of k0 holds a whole tar at a 512-byte boundary of its bytes: k0 is built with that
    caption, its class kept, and no sample is made of what the caption holds (GNU tar and tarfile
    list the same members)."""
    caption = b"c" * lead + _forged(_bmp()) + "the end, é".encode()
    text = caption.decode("utf-8")  # a caption a build keeps
    path = _tar(tmp_path / "t.tar", {"k0.txt": caption})
    assert _offsets(path)["k0.txt"][1] % 512 == 0  # so the forged header lies at a block boundary
    result = _build(path, tmp_path)
    assert result.manifest.skipped == ()
    ds = CachedDataset(tmp_path / "c")
    sources = [ds.source(i) for i in range(len(ds))]
    assert sources == _tarfile_images(path) == [f"t.tar/k{i}.png" for i in range(KEYS)]
    assert [ds[i][1]["label"] for i in range(KEYS)] == list(range(KEYS))
    assert ds[0][1]["text"] == text
    for i in range(KEYS):
        assert np.array_equal(ds[i][0].numpy(), _pixels(_png(i)))


def test_a_caption_holding_a_tar_of_a_jpeg_is_judged_by_its_own_bytes(tmp_path):
    """A JPEG is not UTF-8, so k0's caption is not text: k0 is left out for that reason alone, and
    nothing is made of the tar inside it."""
    path = _tar(tmp_path / "t.tar", {"k0.txt": b"c" * 512 + _forged(_jpeg(0))})
    result = _build(path, tmp_path)
    assert [(s.path, s.reason) for s in result.manifest.skipped] == [
        ("t.tar/k0.png", "its .txt is not UTF-8 text")
    ]
    ds = CachedDataset(tmp_path / "c")
    assert [ds.source(i) for i in range(len(ds))] == _tarfile_images(path)[1:]
    assert [ds[i][1] for i in range(len(ds))] == list(range(1, KEYS))


def _with_comment(jpeg: bytes, blob: bytes) -> bytes:
    """``jpeg`` with a COM segment right after its SOI holding ``blob`` at byte 512 of the file."""
    data = b"c" * (512 - 6) + blob
    return jpeg[:2] + b"\xff\xfe" + (len(data) + 2).to_bytes(2, "big") + data + jpeg[2:]


@pytest.mark.parametrize(
    "name, image",
    [
        ("k1.png", _padded(_png(1)) + _forged(_jpeg(9))),  # after its IEND, at a block boundary
        ("k1.jpg", _padded(_jpeg(1)) + _forged(_jpeg(9))),  # after its EOI
        ("k1.jpg", _with_comment(_jpeg(1), _forged(_jpeg(9)))),  # inside a comment segment
    ],
    ids=["png-after-iend", "jpeg-after-eoi", "jpeg-comment"],
)
def test_an_image_holding_a_tar_is_built_from_its_own_bytes(tmp_path, name, image):
    """k1's image holds a whole tar at a 512-byte boundary: it is built (its pixels OpenCV's decode
    of its bytes), not skipped as damaged, and nothing is made of the tar inside it."""
    path = _tar(tmp_path / "t.tar", images={1: (name, image)})
    result = _build(path, tmp_path)
    assert result.manifest.skipped == ()
    ds = CachedDataset(tmp_path / "c")
    assert [ds.source(i) for i in range(len(ds))] == _tarfile_images(path)
    assert [ds.source(i) for i in range(len(ds))] == [
        f"t.tar/{name if i == 1 else f'k{i}.png'}" for i in range(KEYS)
    ]
    assert [ds[i][1] for i in range(KEYS)] == list(range(KEYS))
    assert _member_bytes(path, name) == image
    assert np.array_equal(ds[1][0].numpy(), _pixels(image))
    assert np.array_equal(ds[2][0].numpy(), _pixels(_png(2)))


def test_a_size_enlarged_onto_a_later_header_is_read_as_tarfile_reads_it(tmp_path):
    """k1.png's size made to run exactly onto k3.png's header: the bytes it claims are its own (as
    GNU tar and tarfile read them; nothing tells them from an image that holds a tar), so k1.cls and
    k2 are inside it, never members; k1.png decodes to its own pixels and has no class."""
    path = _tar(tmp_path / "t.tar")
    at = _offsets(path)
    data = bytearray(path.read_bytes())
    header = data[at["k1.png"][0] : at["k1.png"][0] + 512]
    header[124:136] = b"%011o\0" % (at["k3.png"][0] - at["k1.png"][1])
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)  # its checksum right, as a damaged writer would
    data[at["k1.png"][0] : at["k1.png"][0] + 512] = header
    path.write_bytes(bytes(data))
    result = _build(path, tmp_path)
    assert result.manifest.skipped == ()
    ds = CachedDataset(tmp_path / "c")
    sources = [ds.source(i) for i in range(len(ds))]
    assert (
        sources == _tarfile_images(path) == ["t.tar/k0.png", "t.tar/k1.png", "t.tar/k3.png", "t.tar/k4.png"]
    )
    assert [ds[i][1] for i in range(len(ds))] == [0, -1, 3, 4]
    for i, key in enumerate([0, 1, 3, 4]):
        assert np.array_equal(ds[i][0].numpy(), _pixels(_png(key)))


def test_a_member_that_holds_the_magic_but_no_header_and_an_unread_tar_member_are_kept_whole(tmp_path):
    """A caption with ``ustar`` at a header's magic offset is text, and one holding a whole header
    off the 512-byte blocks is text too; a ``.tar`` member holds headers of its own and is never
    read, so nothing of it is found."""
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
    job_read = source.reader.open(None, 0)  # a job reads each image's bytes, and gives them whole
    with tarfile.open(path) as tar:
        for rel, target in zip(source.paths, source.targets):
            assert job_read(rel, target) == tar.extractfile(rel.split("/", 1)[1]).read()
