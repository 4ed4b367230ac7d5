"""WebDataset tars member by member: what discovery lists (each left-out member with its exact
reason), the targets a key's members give, and a shard job's reads by offset, in this process."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest
from sourcekit import make_objects, write_tars

from cachekit.build.sources.sourceoptions import SourceOptions
from cachekit.build.sources.webdataset import TarReader, tar_source
from cachekit.image.ops import DecodeError


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    ok, buf = cv2.imencode(".png", rng.integers(0, 255, (12, 16, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


def _tar(path: Path, members: list[tuple], fmt=tarfile.GNU_FORMAT) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data, *info in members:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            for key, value in (info[0] if info else {}).items():
                setattr(member, key, value)
            tar.addfile(member, io.BytesIO(data) if data else None)
    return str(path)


def _reasons(source) -> dict[str, str]:
    return dict(source.ignored)


def test_members_named_outside_the_archive_links_and_folders(tmp_path):
    png = _png(0)
    path = _tar(
        tmp_path / "a.tar",
        [
            ("dir", b"", {"type": tarfile.DIRTYPE}),
            ("dir/ok.png", png),
            ("back\\slash.png", png),
            ("link.png", b"", {"type": tarfile.SYMTYPE, "linkname": "dir/ok.png"}),
        ],
    )
    source = tar_source(path, SourceOptions())
    assert list(source.paths) == ["a.tar/dir/ok.png"]
    reasons = _reasons(source)
    assert reasons.pop("a.tar/back\\slash.png") == "a name outside the archive, left out"
    assert reasons.pop("a.tar/link.png") == "a link, left out"
    assert reasons == {}


def test_a_name_with_a_nul_is_outside_the_archive(tmp_path):
    from cachekit.build.sources.webdataset import _member_problem

    assert _member_problem(tarfile.TarInfo("a\0b.png")) == "a name outside the archive, left out"
    assert _member_problem(tarfile.TarInfo("a\\b.png")) == "a name outside the archive, left out"
    folder = tarfile.TarInfo("d")
    folder.type = tarfile.DIRTYPE
    assert _member_problem(folder) == ""
    assert _member_problem(tarfile.TarInfo("d/x.png")) is None


def test_keys_group_members_by_folder_and_first_dot(tmp_path):
    png = _png(1)
    path = _tar(
        tmp_path / "k.tar",
        [
            ("a/x.seg.PNG", png),  # key a/x, extension seg.png: not an image key (the first dot)
            ("a/x.JPG", png),  # extension case: an image
            ("a/x.cls", b" 7\n"),
            ("b.png", png),
            ("b.txt", "a caption, é".encode()),
            ("c.webp", png),
            ("c.json", json.dumps({"label": 2}).encode()),
            ("d.jpeg", png),
            ("d.json", b"5"),
            ("e.png", png),
            ("e.cls", b"-1"),
            ("f/x.png", png),  # the same stem in another folder: another key
        ],
    )
    source = tar_source(path, SourceOptions())
    assert list(source.paths) == [
        "k.tar/a/x.JPG",
        "k.tar/b.png",
        "k.tar/c.webp",
        "k.tar/d.jpeg",
        "k.tar/e.png",
        "k.tar/f/x.png",
    ]
    assert source.labels.tolist()[0] == 7 and source.labels.tolist()[2:4] == [2, 5]
    assert source.targets[1]["text"] == "a caption, é"
    assert source.ignored == ()


@pytest.mark.parametrize(
    "part, why",
    [
        (("x.json", b"[1, 2]"), "its .json is not an object of the schema's names"),
        (("x.json", b"\xff"), "its .json is not JSON"),
        (("x.txt", b"\xff\xfe"), "its .txt is not UTF-8 text"),
        (("x.cls", "²".encode()), "its .cls '²' is not an integer class"),
        (("x.cls", b"1" * 19), "its .cls '1111111111111111111' is not an integer class"),
    ],
)
def test_a_target_that_does_not_read_leaves_its_sample_out_with_why(tmp_path, part, why):
    path = _tar(tmp_path / "t.tar", [("x.png", _png(2)), part, ("y.png", _png(3))])
    source = tar_source(path, SourceOptions())
    assert list(source.paths) == ["t.tar/y.png"]
    (where, reason), *rest = source.ignored
    assert where == "t.tar/x.png" and reason.startswith(why) and not rest


def test_a_second_target_and_a_key_without_an_image_are_listed(tmp_path):
    path = _tar(
        tmp_path / "t.tar",
        [("x.png", _png(2)), ("x.cls", b"1"), ("x.cls", b"2"), ("lonely.cls", b"3"), ("y.npy", b"\0" * 8)],
    )
    source = tar_source(path, SourceOptions())
    assert list(source.paths) == ["t.tar/x.png"] and source.labels.tolist() == [1]
    assert source.ignored == (
        ("t.tar/x.cls", "a second .cls for the key 'x', left out"),
        ("t.tar/lonely", "no image (jpg, jpeg, png, webp)"),
    )


def test_a_member_over_its_limit_is_listed_with_its_size(tmp_path):
    from cachekit.build.sources import webdataset

    big = b"{" + b" " * webdataset.MAX_TARGET_BYTES + b"}"
    path = _tar(tmp_path / "t.tar", [("x.png", _png(2)), ("x.json", big), ("y.png", _png(3))])
    source = tar_source(path, SourceOptions())
    assert list(source.paths) == ["t.tar/y.png"]
    assert source.ignored == (
        ("t.tar/x.json", f"{len(big)} bytes, over the {webdataset.MAX_TARGET_BYTES} a .json member may have"),
    )


def test_a_shard_jobs_reads_are_each_members_bytes_across_tars(tmp_path):
    _, items = make_objects(tmp_path / "objects", 5)
    pattern = write_tars(items, tmp_path / "tars", files=2)
    source = tar_source(pattern, SourceOptions(box_format="xywh"))  # the boxes as sourcekit writes them
    assert isinstance(source.reader, TarReader) and len(source.reader.files) == 2
    assert [t["at"][0] for t in source.targets] == [0, 0, 0, 1, 1]
    read = source.reader.open(None, 0)
    wanted = {Path(it.path).name: Path(it.path).read_bytes() for it in items}
    order = [*range(len(source.paths)), 0, len(source.paths) - 1, 0]  # back and forth between the tars
    for i in order:
        rel = source.paths[i]
        assert read(rel, source.targets[i]) == wanted[rel.rsplit("/", 1)[1]]
    size = source.targets[0]["at"][2]
    limited = source.reader.open(None, size - 1)
    with pytest.raises(
        DecodeError, match=rf"^{size} bytes, over the {size - 1}-byte limit \(see --max-pixels\)$"
    ):
        limited(source.paths[0], source.targets[0])
    assert (
        source.reader.open(None, size)(source.paths[0], source.targets[0])
        == wanted[source.paths[0].rsplit("/", 1)[1]]
    )


def test_target_messages_and_limits_at_their_edges(tmp_path):
    from cachekit.build.sources import webdataset

    exact = b'{"text": "' + b"a" * (webdataset.MAX_TARGET_BYTES - 12) + b'"}'
    assert len(exact) == webdataset.MAX_TARGET_BYTES
    rng = np.random.default_rng(5)
    ok, big = cv2.imencode(".png", rng.integers(0, 255, (700, 700, 3), dtype=np.uint8))
    assert ok and len(big) > webdataset.MAX_TARGET_BYTES  # an image may be larger than a target
    path = _tar(
        tmp_path / "t.tar",
        [
            ("a.png", _png(1)), ("a.json", exact),
            ("b.png", big.tobytes()),
            ("c.png", _png(2)), ("c.cls", b"\xff"),
            ("d.png", _png(3)), ("d.cls", b"x" * 50),
            ("e.png", _png(4)), ("e.json", b"\xff"),
        ],
    )  # fmt: skip
    source = tar_source(path, SourceOptions())
    assert list(source.paths) == ["t.tar/a.png", "t.tar/b.png"]
    assert source.ignored == (
        ("t.tar/c.png", "its .cls '\ufffd' is not an integer class"),
        ("t.tar/d.png", f"its .cls {'x' * 40!r} is not an integer class"),
        (
            "t.tar/e.png",
            "its .json is not JSON ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
        ),
    )


def test_a_member_cut_short_is_listed_and_one_that_ends_with_the_file_is_kept(tmp_path):
    first, second = _png(1), _png(2)
    path = Path(_tar(tmp_path / "t.tar", [("a.png", first), ("b.png", second)]))
    with tarfile.open(path) as tar:
        b = tar.getmember("b.png")
    data = path.read_bytes()
    path.write_bytes(data[: b.offset_data + len(second) - 1])  # the last byte of b.png gone
    source = tar_source(str(path), SourceOptions())
    assert list(source.paths) == ["t.tar/a.png"]
    assert ("t.tar/b.png", "runs past the end of the tar (cut short)") in source.ignored
    assert not [w for w, _ in source.ignored if w == "t.tar/b"]  # not also "no image"
    path.write_bytes(data[: b.offset_data + len(second)])  # ends exactly with b.png's bytes
    source = tar_source(str(path), SourceOptions())
    assert list(source.paths) == ["t.tar/a.png", "t.tar/b.png"]
