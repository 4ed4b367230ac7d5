"""A raw folder on object storage is listed a page at a time into compact arrays, in local discovery's order."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit.build.sources import discover, listing
from cachekit.build.sources.listing import PathColumn, list_files

s3fs = pytest.importorskip("s3fs")

#: Names whose order differs between the store's (bytes: '-' < '/') and discovery's (folder by folder).
TRICKY = [
    "a/x.jpg",
    "a-b/x.jpg",
    "a.jpg",
    "b/deeper/y.png",
    "b/deeper.jpg",
    "b/c.jpg",
    "b/z/w.jpg",
    "c/ünï.JPG",
    "c/notes.txt",
    "c/anim.gif",
    ".hidden/h.jpg",
    "d/.git/k.jpg",
]


def _write(tmp_path, names) -> None:
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (len(name) + 1))


def _same(remote, local) -> None:
    assert remote.layout == local.layout and remote.classes == local.classes
    assert list(remote.paths) == list(local.paths)
    assert remote.labels.tolist() == local.labels.tolist() and remote.sizes.tolist() == local.sizes.tolist()
    assert [p for p, _ in remote.ignored] == [p for p, _ in local.ignored] and remote.unread == local.unread


def test_a_remote_folder_is_discovered_as_the_same_folder_on_disk(s3_endpoint, tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    _write(raw, TRICKY)
    fs = s3fs.S3FileSystem(anon=False)
    fs.put(str(raw) + "/", "datasets/tricky", recursive=True)
    monkeypatch.setattr(listing, "_PAGE", 2)  # many pages per folder
    remote = discover("s3://datasets/tricky")
    _same(remote, discover(raw))
    assert isinstance(remote.paths, PathColumn) and remote.paths.index("b/deeper/y.png") == 3
    (tmp_path / "labels.csv").write_text("file,label\nb/c.jpg,cat\na/x.jpg,dog\nmissing.jpg,cat\n")
    _same(discover("s3://datasets/tricky", tmp_path / "labels.csv"), discover(raw, tmp_path / "labels.csv"))


def test_a_filesystem_without_pages_lists_folder_by_folder(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    raw = tmp_path / "raw"
    _write(raw, TRICKY)
    fs = fsspec.filesystem("memory")
    fs.put(str(raw) + "/", "/tricky", recursive=True)
    try:
        _same(discover("memory://tricky"), discover(raw))
    finally:
        fs.rm("/tricky", recursive=True)


def test_thousands_of_objects_are_held_as_compact_arrays_a_page_at_a_time(s3_endpoint, monkeypatch):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]  # the loopback server's own store: filled fast
    for k in range(2_500):
        backend.put_object("datasets", f"many/c{k % 2}/{k:06d}.jpg", b"x" * (k % 7 + 1))
    pages = []
    original = listing._pages

    def pages_seen(fs, folder):
        for page in original(fs, folder):
            pages.append(len(page))
            yield page

    monkeypatch.setattr(listing, "_pages", pages_seen)
    fs = s3fs.S3FileSystem(anon=False, skip_instance_cache=True)
    found = list_files(fs, "datasets/many")
    assert len(found) == 2_500 and max(pages) <= 1_000 and len(pages) >= 3  # paged, not one find
    assert not fs.dircache  # and nothing kept in the filesystem's listings cache
    assert found.nbytes / len(found) < 24 + 8 + len("c0/000000.jpg") + 1  # sizes, stamps, offsets, path
    assert list(found.paths) == sorted(found.paths, key=lambda p: p.split("/"))
    assert found.sizes.tolist() == [int(p[-10:-4]) % 7 + 1 for p in found.paths]


def test_a_path_column_is_a_sequence_of_its_paths():
    names = ["a/x.jpg", "ü/y.png", "z"]
    blob = np.frombuffer("".join(names).encode(), dtype=np.uint8)
    column = PathColumn(blob, np.cumsum([0, *(len(n.encode()) for n in names)]))
    assert list(column) == names and column[-1] == "z" and column[1:] == names[1:] and column == tuple(names)
    assert list(column.take([2, 0])) == ["z", "a/x.jpg"] and column.take([0, 1, 2]) is column
    with pytest.raises(IndexError):
        column[3]
