"""Truncated and corrupt JPEGs that a decoder "successfully" fills grey: found from the file's
structure and from what the decoder reports.

libjpeg decodes a JPEG whose data runs out, or is cut and followed by an end marker, without an
error: the missing blocks come out flat grey and it only prints "Premature end of JPEG file" or
"Corrupt JPEG data: premature end of data segment" to the process's stderr. A build must skip
such an input with its reason, so two checks run on every JPEG input:

- ``structure_problem`` walks the markers (microseconds: regular expressions over the entropy-coded
  data, no Huffman decoding): every component must be in some scan; a progressive JPEG's scans must
  bring every coefficient of every component to its last bit (a file cut and given an end marker
  loses its last scans); with restart intervals, each scan must hold all its restart markers.
- ``decoder_messages`` hears what libjpeg (inside OpenCV) prints while one image decodes, by
  pointing file descriptor 2 at an in-memory file for the call; a message of missing or corrupt
  data (``missing_data``) is a skip. Other output printed meanwhile is passed on to stderr. The
  redirection is process-wide, so decodes that listen take turns (a lock): build workers decode on
  one thread each; a loader that decodes on many threads does not listen.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = ["structure_problem", "decoder_messages", "missing_data"]

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
#: A marker inside entropy-coded data: 0xFF followed by neither a stuffed 0x00, a restart marker
#: (0xD0-0xD7) nor another fill byte.
_MARKER = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")
_RESTART = re.compile(rb"\xff[\xd0-\xd7]")
_TRUNCATED = "truncated JPEG"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _frame(seg: bytes) -> tuple[int, int, dict[int, tuple[int, int]]] | None:
    """(height, width, {component id: (h, v) sampling}) of a start-of-frame segment."""
    if len(seg) < 6:
        return None
    height, width, count = int.from_bytes(seg[1:3], "big"), int.from_bytes(seg[3:5], "big"), seg[5]
    if len(seg) < 6 + 3 * count:
        return None
    comps = {seg[6 + 3 * i]: (seg[7 + 3 * i] >> 4, seg[7 + 3 * i] & 15) for i in range(count)}
    return height, width, comps


def _mcus(frame, ids: list[int]) -> int:
    """Minimum coded units in a scan of components ``ids`` (interleaved when several)."""
    height, width, comps = frame
    hmax = max(h for h, _ in comps.values()) or 1
    vmax = max(v for _, v in comps.values()) or 1
    if len(ids) > 1:
        return _ceil(width, 8 * hmax) * _ceil(height, 8 * vmax)
    h, v = comps.get(ids[0], (1, 1))
    return _ceil(_ceil(width * h, hmax), 8) * _ceil(_ceil(height * v, vmax), 8)


def structure_problem(data: bytes) -> str | None:
    """Why the JPEG ``data`` lacks data its structure promises (a skip reason), or None.

    Anything this walk cannot follow is left to the decoder (None): it only ever reports what
    the file itself shows missing.
    """
    if not data.startswith(b"\xff\xd8"):
        return None
    pos, n = 2, len(data)
    frame, progressive, restart = None, False, 0
    scans: list[tuple[list[int], int, int, int, int]] = []  # (components, Ss, Se, Ah, Al)
    while pos + 1 < n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xD9:  # end of image
            break
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        if pos + 4 > n:
            return f"{_TRUNCATED} (cut inside a marker)"
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        seg = data[pos + 4 : pos + 2 + length]
        if length < 2 or len(seg) != length - 2:
            return f"{_TRUNCATED} (a header segment is cut short)"
        if marker in _SOF and frame is None:
            frame, progressive = _frame(seg), marker in _PROGRESSIVE
            if frame is None:
                return None
        elif marker == 0xDD and len(seg) >= 2:
            restart = int.from_bytes(seg[:2], "big")
        elif marker == 0xDA:
            if frame is None or not seg or len(seg) < 1 + 2 * seg[0] + 3:
                return None
            count = seg[0]
            ids = [seg[1 + 2 * i] for i in range(count)]
            ss, se, a = seg[1 + 2 * count], seg[2 + 2 * count], seg[3 + 2 * count]
            start = pos + 2 + length
            found = _MARKER.search(data, start)
            stop = found.start() if found else n
            if restart and frame[0] and frame[1]:
                expected = _ceil(_mcus(frame, ids), restart) - 1
                if len(_RESTART.findall(data, start, stop)) < expected:
                    return f"{_TRUNCATED} (a scan ends before its last restart marker)"
            scans.append((ids, ss, se, a >> 4, a & 15))
            pos = stop
            continue
        pos += 2 + length
    if frame is None or not scans:
        return None
    return _missing_scans(frame, progressive, scans)


def _missing_scans(frame, progressive: bool, scans) -> str | None:
    comps = frame[2]
    if any(c not in {i for ids, *_ in scans for i in ids} for c in comps):
        return f"{_TRUNCATED} (a colour component has no scan: the file stops before it)"
    if not progressive:
        return None
    bits = {c: [None] * 64 for c in comps}  # the lowest bit each coefficient has, None: not sent
    for ids, ss, se, _ah, al in scans:
        for c in ids:
            for k in range(min(ss, 63), min(se, 63) + 1):
                if c in bits:
                    bits[c][k] = al
    if any(b != 0 for per in bits.values() for b in per):
        return f"{_TRUNCATED} (a progressive JPEG whose last scans are missing)"
    return None


#: What libjpeg prints when data is missing or corrupt (an extraneous byte before a marker, or an
#: unknown JFIF revision, is harmless and not a skip).
_MISSING = re.compile(
    r"premature end|corrupt jpeg data: (?!\d+ extraneous bytes)|inconsistent progression|"
    r"invalid jpeg file structure|bogus|huffman",
    re.IGNORECASE,
)
#: Lines of libjpeg's own (passed on to stderr only when they are not about the image heard).
_LIBJPEG = re.compile(r"^(corrupt jpeg data|premature end|warning|invalid jpeg|inconsistent|bogus)", re.I)
_LISTEN = threading.Lock()
_SINK: dict[str, int] = {}  # per process: an in-memory file descriptor


def _sink() -> int:
    key = str(os.getpid())
    if key not in _SINK:
        _SINK.clear()  # a forked child makes its own
        if hasattr(os, "memfd_create"):
            _SINK[key] = os.memfd_create("cachekit-decoder-messages", os.MFD_CLOEXEC)
        else:
            import tempfile

            _SINK[key] = os.dup(tempfile.TemporaryFile().fileno())
    return _SINK[key]


@contextlib.contextmanager
def decoder_messages() -> Iterator[Callable[[], str]]:
    """``with decoder_messages() as said: decode(...)``; ``said()`` is what the decoder printed.

    Anything else printed to stderr meanwhile (another thread's complaint) is passed on after.
    """
    heard: list[str] = []
    with _LISTEN:
        try:
            sink = _sink()
            os.ftruncate(sink, 0)
            os.lseek(sink, 0, os.SEEK_SET)
            saved = os.dup(2)
        except (
            OSError
        ):  # no stderr to borrow (a daemon's closed fd 2), no memory file: the structure check stands
            yield lambda: ""
            return
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        try:
            os.dup2(sink, 2)
            try:
                yield lambda: "".join(heard)
            finally:
                os.dup2(saved, 2)
        finally:
            os.close(saved)
        text = os.pread(sink, 1 << 16, 0).decode(errors="replace")
    ours = [line for line in text.splitlines() if _LIBJPEG.match(line.strip())]
    others = [line for line in text.splitlines() if line.strip() and line not in ours]
    heard.append("\n".join(ours))
    if others:
        with contextlib.suppress(OSError):
            os.write(2, ("\n".join(others) + "\n").encode())


def missing_data(messages: str) -> str | None:
    """The skip reason for a decode whose decoder said ``messages``, or None when it said nothing bad."""
    for line in messages.splitlines():
        if _MISSING.search(line):
            return f"truncated or corrupt JPEG (the decoder said: {line.strip()[:120]})"
    return None
