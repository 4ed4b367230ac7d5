"""WebDataset tar shards as a build's source (``shards/train-{000000..000099}.tar``): members grouped
by key (``dir/key.jpg`` + ``dir/key.cls``), the image from ``jpg``/``jpeg``/``png``/``webp``, the
class from ``cls``, a caption from ``txt``, boxes and labels from ``json`` (the schema's names).

Read with the standard ``tarfile`` module, never extracted: discovery walks each tar's chain of
headers (reading only the small ``cls``/``txt``/``json`` members) and records where each image lies;
a shard job reads those bytes by offset, one image at a time. Only headers on the chain are trusted:
each header's size leads to the next, and a member's own bytes are never read as a header, whatever
they hold (a caption or an image may hold a whole tar). A header that does not read (a bad checksum),
or states a negative size or a PAX size that is no number or not its own, ends the walk: its size
is not known, so neither is where the next member starts, and a scan for a header-like block could
land inside a member's bytes and build a sample from them; it is listed with its offset, with the
key read just before it (whose members may go on past it), and the rest of the file is not read.
GNU tar scans on (and lists members made of a member's bytes), ``tarfile`` stops silently; both
stop at the first end-of-archive block, as discovery does (data after it is listed, not read). A
member named outside the archive (``../``, ``/``), a link, a device or FIFO, a sparse member, or
one of an absurd size is left out and reported; one running past the end of the tar ends the walk
(cut short); a tar that cannot be read at all (not a tar) is left out whole, with its reason.
"""

from __future__ import annotations

import json
import posixpath
import re
import tarfile
from dataclasses import dataclass

from ...image.ops import DecodeError
from .inputtable import Source
from .layouts import WEBDATASET, Request
from .recordfiles import RecordFile, RecordRows, find_files, open_file, read_range
from .samples import json_target
from .sourceoptions import SourceOptions

__all__ = ["discover", "tar_source", "TarReader", "IMAGE_KEYS", "MAX_TARGET_BYTES"]

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
_TARGET_KEYS = ("cls", "txt", "json")
#: Largest ``cls``/``txt``/``json`` member read (a target, not a payload).
MAX_TARGET_BYTES = 1 << 20
#: Largest image member (as a file input's limit under the default ``--max-pixels``).
MAX_IMAGE_BYTES = 1 << 30


@dataclass(frozen=True)
class TarReader:
    """A shard job's reads: each image's bytes at the offset discovery found, from its tar."""

    files: tuple[str, ...]
    url: bool
    sequential = True  # members are read in their tars' order

    def open(self, storage_options: dict | None, max_bytes: int):
        state: dict = {"index": None, "fh": None}

        def read(rel: str, target) -> bytes:
            f, offset, size = target["at"]
            if max_bytes and size > max_bytes:
                raise DecodeError(f"{size} bytes, over the {max_bytes}-byte limit (see --max-pixels)")
            if state["index"] != f:
                if state["fh"] is not None:
                    state["fh"].close()
                state["fh"], state["index"] = open_file(self.files[f], self.url, storage_options), f
            return read_range(state["fh"], offset, size)

        return read


def _member_problem(m: tarfile.TarInfo) -> str | None:
    name = m.name
    if name.startswith("/") or ".." in name.split("/") or "\\" in name or "\0" in name:
        return "a name outside the archive, left out"
    if m.issym() or m.islnk():
        return "a link, left out"
    if m.isdir():
        return ""  # folders are only structure
    if not m.isfile():
        return "not a regular file (a device, FIFO or other), left out"
    if m.issparse():  # its bytes are not stored in one run from its offset
        return "a sparse member, left out"
    return None


def _split(name: str) -> tuple[str, str]:
    """WebDataset's key and extension: the folder and the base name up to its first dot."""
    folder, base = posixpath.split(name)
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


#: A ``.cls`` member's text: an integer of ASCII digits, short enough for ``int()`` (a class is < 2**20).
_CLS = re.compile(r"^-?[0-9]{1,18}$")


def _target(parts: dict[str, bytes]) -> dict:
    target: dict = {}
    if "json" in parts:
        try:
            found = json.loads(parts["json"].decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # nested past Python's stack
            raise DecodeError(f"its .json is not JSON ({' '.join(str(exc).split())[:100]})") from None
        if isinstance(found, dict):
            target.update(found)
        elif isinstance(found, int):
            target["label"] = found
        else:
            raise DecodeError("its .json is not an object of the schema's names")
    if "cls" in parts:
        text = parts["cls"].decode("utf-8", "replace").strip()
        if not _CLS.match(text):  # ASCII digits, bounded: "²" is a digit to isdigit() but not to int()
            raise DecodeError(f"its .cls {text[:40]!r} is not an integer class")
        target["label"] = int(text)
    if "txt" in parts:
        try:
            target["text"] = parts["txt"].decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("its .txt is not UTF-8 text") from None
    return target


def _blocks(size: int) -> int:
    """The bytes of the 512-byte blocks a member of ``size`` bytes takes in its tar."""
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _member(fh, m: tarfile.TarInfo, file: RecordFile, keys: dict, ignored: list) -> None:
    """Note one member: an image's place, a target's bytes, or why it is left out."""
    where = f"{file.name}/{m.name}"
    problem = _member_problem(m)
    if problem is not None:
        if problem:
            ignored.append((where, problem))
        return
    key, ext = _split(m.name)
    if ext not in IMAGE_KEYS and ext not in _TARGET_KEYS:
        return  # other members (.pickle, .npy, ...) are never read
    entry = keys.setdefault(key, {})
    limit = MAX_IMAGE_BYTES if ext in IMAGE_KEYS else MAX_TARGET_BYTES
    if m.size > limit:
        ignored.append((where, f"{m.size} bytes, over the {limit} a .{ext} member may have"))
        entry["bad"] = True
        return
    if m.offset_data + m.size > file.size:
        ignored.append((where, "runs past the end of the tar (cut short)"))
        entry["bad"] = True
        return
    if ext in IMAGE_KEYS:
        if "image" not in entry:
            entry["image"] = (m.name, m.offset_data, m.size)  # its shard job reads it
        else:  # a key seen again (a second image, or the same name twice): not a sample
            ignored.append((where, f"a second image for the key {key!r}, left out"))
        return
    if ext in entry.get("parts", {}):
        ignored.append((where, f"a second .{ext} for the key {key!r}, left out"))
    else:
        entry.setdefault("parts", {})[ext] = read_range(fh, m.offset_data, m.size)


#: A PAX record's number: decimal digits (``tarfile`` reads any other as 0).
_PAX_NUMBER = re.compile(r"^[0-9]+$")


def _size_problem(m: tarfile.TarInfo, next_at: int) -> str | None:
    """Why ``m``'s size cannot lead to the next header (which ``tarfile`` put at ``next_at``), or None.
    ``tarfile`` reads a PAX size that is no number as 0 (its bytes would be read as the next header),
    walks back over a negative one (forever), and reads a global PAX size as the member's without
    moving the next header: each ends the chain here."""
    pax = m.pax_headers.get("size")
    if pax is not None and not _PAX_NUMBER.match(pax):
        return f"a PAX size {pax[:20]!r} that is no number"
    if m.size < 0:
        return f"a negative size ({m.size})"
    if m.isreg() and not m.issparse() and next_at != m.offset_data + _blocks(m.size):
        return f"a size of {m.size} bytes that is not the one its header states"
    return None


def _walk(tar: tarfile.TarFile, fh, file: RecordFile, keys: dict, ignored: list) -> None:
    """Every member on the tar's chain of headers, in order, each header's size leading to the
    next; nothing else is read as a header. The chain ends at the end-of-archive block or the end of
    the file, at a member that runs past the end (listed: all that follows lies inside the bytes it
    claims), or at a header that does not read (``_broken``)."""
    last: str | None = None  # the key of the member read last
    while True:
        try:
            m = tar.next()
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:  # a PAX or GNU record
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
            _broken(file, keys, ignored, tar.offset, last, why)
            return
        if m is None:
            _ended(fh, file, keys, ignored, tar.offset, last)
            return
        problem = _size_problem(m, tar.offset)
        if problem is not None:
            _broken(file, keys, ignored, m.offset, last, problem)
            return
        _member(fh, m, file, keys, ignored)
        if tar.offset > file.size and m.offset_data + m.size > file.size:  # all that follows is its bytes
            said = f"{m.name!r}, whose header at byte {m.offset} says {m.size} bytes, runs past the end"
            ignored.append((file.name, f"{said} (cut short, or its size damaged): nothing after it is read"))
            _leave_out(file, keys, ignored, _split(m.name)[0], f"its members may go on inside {m.name!r}")
            return
        if tar.offset >= file.size:
            return
        last = _split(m.name)[0]


def _ended(fh, file: RecordFile, keys: dict, ignored: list, at: int, last: str | None) -> None:
    """The chain stopped at byte ``at``: the end of the file, the end-of-archive block (data after
    it is listed, not read, as ``tar`` and ``tarfile`` stop there too), or a header that does not read."""
    fh.seek(at)
    block = fh.read(tarfile.BLOCKSIZE)
    if block.strip(b"\0"):
        try:
            tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            why = "it does not read"
        except tarfile.TarError as exc:
            why = str(exc)
        _broken(file, keys, ignored, at, last, why)
        return
    after = _data_after(fh, at + len(block))
    if after is not None:
        ignored.append(
            (file.name, f"data at byte {after}, after its end-of-archive block at byte {at}, is not read "
             "(tar reads no further; two tars joined by cat?)")
        )  # fmt: skip


def _data_after(fh, start: int) -> int | None:
    """The offset of the first byte that is not zero from ``start`` to the end of the file, or None."""
    fh.seek(start)
    pos = start
    while chunk := fh.read(1 << 20):
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return pos + len(chunk) - len(stripped)
        pos += len(chunk)
    return None


def _broken(file: RecordFile, keys: dict, ignored: list, at: int, last: str | None, why: str) -> None:
    """A header on the chain at byte ``at`` that does not read: listed, and nothing after it is read
    (its size is not known, so where the next member starts is not either: any header-like block
    found further on may lie inside a member's bytes). The key read just before it is left out too:
    its members may go on past it."""
    rest = file.size - at
    ignored.append(
        (file.name, f"a damaged header at byte {at} ({why}): the {rest} bytes from there on are not read "
         "(where its member ends is not known)")
    )  # fmt: skip
    _leave_out(file, keys, ignored, last, f"its members may go on past the damaged header at byte {at}")


def _leave_out(file: RecordFile, keys: dict, ignored: list, key: str | None, why: str) -> None:
    """The sample of ``key`` (if any, and not left out already) left out, listed with ``why``."""
    entry = keys.get(key) if key is not None else None
    if entry is not None and not entry.get("bad"):
        entry["bad"] = True
        ignored.append((f"{file.name}/{key}", f"{why}, left out"))


def _tar_rows(file: RecordFile, f: int, url: bool, options, storage_options) -> tuple[list, list, str | None]:
    """``(rows, ignored, problem)``: ``(rel, target, label)`` per sample of one tar, in member order."""
    keys: dict[str, dict] = {}
    ignored: list[tuple[str, str]] = []
    rows = []
    sample_options = options.samples()
    try:
        with open_file(file.where, url, storage_options) as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            _walk(tar, fh, file, keys, ignored)
            for key, entry in keys.items():
                if "image" not in entry:
                    if not entry.get("bad"):
                        ignored.append((f"{file.name}/{key}", f"no image ({', '.join(IMAGE_KEYS)})"))
                    continue
                name, offset, size = entry["image"]
                rel = f"{file.name}/{name}"
                if entry.get("bad"):
                    continue  # its key left out for another member (listed)
                try:
                    raw, label = json_target(_target(entry.get("parts", {})), sample_options)
                except DecodeError as exc:
                    ignored.append((rel, str(exc)))
                    continue
                rows.append((rel, raw | {"at": [f, offset, size]}, label))
    except (tarfile.TarError, OSError, EOFError) as exc:
        return [], [], f"not a readable tar ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
    return rows, ignored, None


def tar_source(pattern: str, options: SourceOptions, storage_options: dict | None = None) -> Source:
    """The samples of the tars ``pattern`` names, in tar and member order, with their targets."""
    url = "://" in pattern
    files = find_files(pattern, storage_options, WEBDATASET.files_noun)
    found, most = RecordRows(), options.limit()
    for f, file in enumerate(files):
        if most is not None and len(found.paths) >= most:
            break  # --max-samples: the first samples only
        rows, left_out, problem = _tar_rows(file, f, url, options, storage_options)
        if problem is not None:
            found.ignored.append((file.name, problem))
            continue
        found.ignored += left_out
        for rel, target, label in rows[: None if most is None else most - len(found.paths)]:
            found.add(rel, target, label, file)
    return found.source(
        pattern,
        WEBDATASET.name,
        files,
        options,
        kind="tars",
        names=None,
        reader=TarReader(tuple(f.where for f in files), url),
        columns=False,
    )


def discover(request: Request) -> Source:
    """``base.SourceKind``: the samples of the tars RAW names, read with the build's source options."""
    return tar_source(request.text, request.config.source, request.config.storage_options)
