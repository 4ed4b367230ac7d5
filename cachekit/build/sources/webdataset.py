"""WebDataset tar shards as a build's source (``shards/train-{000000..000099}.tar``): members grouped
by key (``dir/key.jpg`` + ``dir/key.cls``), the image from ``jpg``/``jpeg``/``png``/``webp``, the
class from ``cls``, a caption from ``txt``, boxes and labels from ``json`` (the schema's names).

Read with the standard ``tarfile`` module, never extracted: discovery walks each tar's headers
(reading only the small ``cls``/``txt``/``json`` members) and records where each image lies; a shard
job reads those bytes by offset, one image at a time. A size enlarged exactly onto a later header
hides the members between inside the bytes it claims: each member's blocks are looked through for a
header where they are read anyway (a target at discovery, which then reads on at the header it
found; an image in its shard job, which skips it naming the members it hides, never built), so
discovery reads no image bytes. A member named outside the archive
(``../``, ``/``), a link, a device or FIFO, or of an absurd size is left out and reported; a tar
that cannot be read (cut short, not a tar) is left out whole, with its reason.
"""

from __future__ import annotations

import json
import posixpath
import re
import tarfile
from dataclasses import dataclass

from ...image.ops import DecodeError
from ..inputtable import Source
from ..samples import json_target
from ..sourceoptions import SourceOptions, recorded_options
from .layouts import WEBDATASET, Request
from .recordfiles import RecordFile, RecordRows, find_files, open_file

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
            # its whole blocks (a tar pads each member to 512 bytes): a header may lie in the last one
            data = _read_blocks(state["fh"], offset, size)
            hidden = hidden_members(data)
            if hidden:
                raise DecodeError(hidden_reason(size, hidden))
            return data if len(data) == size else data[:size]

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


def _read_blocks(fh, offset: int, size: int) -> bytes:
    """A member's ``size`` bytes at ``offset`` and the rest of its last block (as far as the file
    goes): the bytes a read of the member fetches anyway, looked through for a header."""
    fh.seek(offset)
    data = fh.read(_blocks(size))
    if len(data) < size:
        raise OSError(f"{size} bytes at {offset} asked, {len(data)} read: the file was cut or changed")
    return data


def _member(fh, m: tarfile.TarInfo, file: RecordFile, keys: dict, ignored: list) -> int | None:
    """Note one member: an image's place, a target's bytes, or why it is left out. Returns the
    offset of a header found inside the blocks of a member read here (a target, or a member left
    out, which no shard job reads), or None: an image a shard job reads is looked through there."""
    where = f"{file.name}/{m.name}"
    problem = _member_problem(m)
    if problem is not None:
        if problem:
            ignored.append((where, problem))
        return None
    key, ext = _split(m.name)
    if ext not in IMAGE_KEYS and ext not in _TARGET_KEYS:
        return None  # other members (.pickle, .npy, ...) are never read
    entry = keys.setdefault(key, {})
    limit = MAX_IMAGE_BYTES if ext in IMAGE_KEYS else MAX_TARGET_BYTES
    if m.size > limit:
        ignored.append((where, f"{m.size} bytes, over the {limit} a .{ext} member may have"))
        entry["bad"] = True
        return _next_header(fh, m.offset_data, m.offset_data + _blocks(m.size))  # damaged input only
    if m.offset_data + m.size > file.size:
        ignored.append((where, "runs past the end of the tar (cut short)"))
        entry["bad"] = True
        return None  # the walk looks for the next header itself
    if ext in IMAGE_KEYS:
        if "image" not in entry:
            entry["image"] = (m.name, m.offset_data, m.size)
            return None  # its shard job looks through its bytes
        # a key seen again (a second image, or the same name twice): not a sample, never read later
        ignored.append((where, f"a second image for the key {key!r}, left out"))
        return _next_header(fh, m.offset_data, m.offset_data + _blocks(m.size))
    data = _read_blocks(fh, m.offset_data, m.size)  # a target: read whole blocks, looked through free
    if ext in entry.get("parts", {}):
        ignored.append((where, f"a second .{ext} for the key {key!r}, left out"))
    else:
        entry.setdefault("parts", {})[ext] = data[: m.size]
    k = _scan(data)
    return None if k is None else m.offset_data + k


#: Where a ustar (GNU, PAX) header holds its magic.
_MAGIC_AT = 257


def _is_header(block: bytes) -> bool:
    """True for a 512-byte block that is a ustar (or GNU, PAX) header with a right checksum."""
    if block[_MAGIC_AT : _MAGIC_AT + 5] != b"ustar":
        return False
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.TarError:
        return False
    return True


def _scan(buf: bytes, start: int = 0) -> int | None:
    """The offset in ``buf`` (which starts on a block) of its first whole header at a 512-byte
    boundary from ``start`` on, or None. Only the blocks whose magic's first byte is a ``u`` are
    looked at further (one byte a block gathered and searched: microseconds over an image)."""
    first = -(-start // tarfile.BLOCKSIZE)
    firsts = buf[first * tarfile.BLOCKSIZE + _MAGIC_AT :: tarfile.BLOCKSIZE]
    at = firsts.find(b"u")
    while at >= 0:
        k = (first + at) * tarfile.BLOCKSIZE
        if k + tarfile.BLOCKSIZE > len(buf):
            return None  # a part of a block: no whole header
        if _is_header(buf[k : k + tarfile.BLOCKSIZE]):
            return k
        at = firsts.find(b"u", at + 1)
    return None


def _next_header(fh, start: int, end: int) -> int | None:
    """The offset of the first header at a 512-byte boundary from ``start`` (rounded up) to ``end``."""
    pos = -(-start // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    while pos < end:
        fh.seek(pos)
        buf = fh.read(min(1 << 20, end - pos))
        if not buf:
            return None
        k = _scan(buf)
        if k is not None:
            return pos + k
        pos += len(buf) - len(buf) % tarfile.BLOCKSIZE or tarfile.BLOCKSIZE
    return None


#: Headers of a member's metadata (a PAX record, a GNU long name): the member is the next header.
_META = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
#: A PAX record of a member's path (``"27 path=some/long/name.jpg\n"``).
_PAX_PATH = re.compile(rb"(?:^|\n)[0-9]+ path=([^\n]*)\n")
#: The most hidden members a reason names.
_NAMED = 8


def hidden_members(data: bytes) -> list[str]:
    """The names in the headers inside a member's blocks ``data``: its size was enlarged over later
    members, hidden in the bytes it claims. Read from the first header found on, header to header
    by their sizes (a header that does not follow is looked for again); none in an intact member."""
    names: list[str] = []
    long_name = None  # a PAX path or GNU long name: the next member's name
    k = _scan(data)
    while k is not None:
        m = tarfile.TarInfo.frombuf(data[k : k + tarfile.BLOCKSIZE], "utf-8", "surrogateescape")
        body = data[k + tarfile.BLOCKSIZE : k + tarfile.BLOCKSIZE + min(m.size, MAX_TARGET_BYTES)]
        if m.type == tarfile.GNUTYPE_LONGNAME:
            long_name = body.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif m.type == tarfile.XHDTYPE:
            path = _PAX_PATH.search(body)
            long_name = path.group(1).decode("utf-8", "surrogateescape") if path else long_name
        elif m.type not in _META:
            names.append(long_name or m.name)
            long_name = None
        k = _scan(data, k + tarfile.BLOCKSIZE + _blocks(m.size))
    return names


def hidden_reason(size: int, names: list[str]) -> str:
    """Why a member whose blocks hold the headers of ``names`` is skipped, naming them."""
    shown = ", ".join(names[:_NAMED]) + (f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")
    hidden = f"{len(names)} member{'s' if len(names) != 1 else ''}"
    return (
        f"its header says {size} bytes, which run over the tar headers of {shown}: damaged; it and the "
        f"{hidden} hidden in it are not built"
    )


def _walk(tar: tarfile.TarFile, fh, file: RecordFile, keys: dict, ignored: list) -> None:
    """Every member of one tar, past damage: a header whose size is wrong (enlarged, a PAX record of
    10**15 bytes) or that does not read ends that member, not the archive: the walk goes on at the
    next valid header (members found there are read; the damaged one is listed as left out), and
    what cannot be read is listed, never silently gone. A size enlarged exactly onto a later header
    hides the members between: the blocks of a member read here (a target) are looked through for
    a header, and the walk reads on at it; an image's are looked through by its shard job."""
    last: tarfile.TarInfo | None = None
    scan_from = 0
    while True:
        why = None
        try:
            m = tar.next()
        except (tarfile.TarError, EOFError, OSError) as exc:
            m, why = None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
        if m is not None:
            hidden = _member(fh, m, file, keys, ignored)
            last, scan_from = m, m.offset_data
            if m.offset_data + m.size <= file.size:
                if hidden is None:
                    continue
                _damaged(m, file, keys, ignored, hidden)  # its size runs over members: read on at them
                tar.offset, scan_from = hidden, hidden + tarfile.BLOCKSIZE
                continue
        # the end, a header that does not read, or a member said to run past the end: any header after?
        found = _next_header(fh, scan_from, file.size) if last is not None else None
        if found is None:
            if why is not None:
                ignored.append((file.name, f"damaged or cut short after {len(keys)} keys ({why})"))
            return
        expected = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        if found < expected and found > last.offset:  # the last member's size runs over a header
            _damaged(last, file, keys, ignored, found)
        elif found > expected and why is None:
            fh.seek(expected)
            if fh.read(tarfile.BLOCKSIZE).strip(b"\0"):  # not the end-of-archive zeros: a bad header
                ignored.append((file.name, f"a damaged header at byte {expected}: read on at byte {found}"))
        elif why is not None:
            ignored.append(
                (file.name, f"a damaged header after {last.name!r} ({why}): read on at byte {found}")
            )
        tar.offset, scan_from = found, found + tarfile.BLOCKSIZE


def _damaged(m: tarfile.TarInfo, file: RecordFile, keys: dict, ignored: list, found: int) -> None:
    """``m``'s size runs over the next header (at ``found``): its bytes are not known, it is left out."""
    key, ext = _split(m.name)
    entry = keys.get(key)
    if entry is None or entry.get("bad") or (ext not in IMAGE_KEYS and ext not in _TARGET_KEYS):
        return  # left out already (listed), or never read
    entry["bad"] = True
    ignored.append(
        (f"{file.name}/{m.name}", f"its header says {m.size} bytes, but the next header is at byte {found}: "
         "damaged, left out")
    )  # fmt: skip


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
                if entry.get("bad"):  # its key left out for another member (listed): no job reads it
                    hidden = _unread(fh, offset, size)
                    if hidden:
                        ignored.append((rel, hidden[2:]))
                    continue
                try:
                    raw, label = json_target(_target(entry.get("parts", {})), sample_options)
                except DecodeError as exc:
                    ignored.append((rel, str(exc) + _unread(fh, offset, size)))
                    continue
                rows.append((rel, raw | {"at": [f, offset, size]}, label))
    except (tarfile.TarError, OSError, EOFError) as exc:
        return [], [], f"not a readable tar ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
    return rows, ignored, None


def _unread(fh, offset: int, size: int) -> str:
    """``"; "`` and why, for an image of a key left out at discovery whose blocks hide members (no
    shard job reads it, so they are named here: damaged input only pays this read), else ``""``."""
    hidden = hidden_members(_read_blocks(fh, offset, size))
    return "; " + hidden_reason(size, hidden) if hidden else ""


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
        kind="tars",
        classes=options.classes,
        names=None,
        extra=lambda fields: {"files": len(files), **recorded_options(options, fields, columns=False)},
        reader=TarReader(tuple(f.where for f in files), url),
    )


def discover(request: Request) -> Source:
    """``base.SourceKind``: the samples of the tars RAW names, read with the build's source options."""
    return tar_source(request.text, request.config.source, request.config.storage_options)
