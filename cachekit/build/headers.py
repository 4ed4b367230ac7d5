"""Image sizes read from file headers, without decoding: the decompression-bomb guard of a build.

A 2.6 MB PNG may claim 30000 x 30000 pixels, and decoding it costs 2.7 GB; a 142-byte PNG may be
65000 x 1, which a shorter-side resize would blow up to 16 million by 256. ``image_size`` reads the
width and height from the header of every format a build reads (JPEG, PNG, BMP, TIFF and BigTIFF,
WebP) so that such files are skipped before any pixel is allocated.
"""

from __future__ import annotations

import struct

from ..image.ops import DecodeError

__all__ = ["image_size", "jpeg_size", "FORMATS_READ"]

#: What a build decodes, by content (not by extension).
FORMATS_READ = "JPEG, PNG, BMP, TIFF or WebP"


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header; None if there is none."""
    i, n = 2, len(data)
    while i + 9 < n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
        if length < 2:
            return None
        i += 2 + length
    return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    w, h = struct.unpack(">II", data[16:24])
    return h, w


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    header = int.from_bytes(data[14:18], "little")
    if header == 12:  # OS/2 BITMAPCOREHEADER
        w, h = struct.unpack("<HH", data[18:22])
    else:
        w, h = struct.unpack("<ii", data[18:26])
    return abs(h), abs(w)


def _webp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 30:
        return None
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return h & 0x3FFF, w & 0x3FFF
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(data[27:30], "little") + 1, int.from_bytes(data[24:27], "little") + 1
    return None


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) of the first image of a TIFF or BigTIFF (the one OpenCV decodes)."""
    endian = "<" if data[:2] == b"II" else ">"
    big = struct.unpack(endian + "H", data[2:4])[0] == 43
    try:
        if big:
            (ifd,) = struct.unpack(endian + "Q", data[8:16])
            (count,) = struct.unpack(endian + "Q", data[ifd : ifd + 8])
            start, entry, value_at = ifd + 8, 20, 12
        else:
            (ifd,) = struct.unpack(endian + "I", data[4:8])
            (count,) = struct.unpack(endian + "H", data[ifd : ifd + 2])
            start, entry, value_at = ifd + 2, 12, 8
        found = {}
        for k in range(min(count, 4096)):
            at = start + k * entry
            tag, kind = struct.unpack(endian + "HH", data[at : at + 4])
            if tag in (256, 257):
                raw = data[at + value_at : at + value_at + 8]
                if kind == 3:  # SHORT
                    found[tag] = struct.unpack(endian + "H", raw[:2])[0]
                elif kind == 4:  # LONG
                    found[tag] = struct.unpack(endian + "I", raw[:4])[0]
                elif kind == 16:  # LONG8 (BigTIFF)
                    found[tag] = struct.unpack(endian + "Q", raw[:8])[0]
    except struct.error:
        return None
    if 256 not in found or 257 not in found:
        return None
    return found[257], found[256]


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the header of an image a build reads; DecodeError if there is none.

    Formats are told by their content, as the decoder does, not by the file's extension.
    """
    if data[:2] == b"\xff\xd8":
        size, kind = jpeg_size(data), "JPEG"
    elif data[:8] == b"\x89PNG\r\n\x1a\n":
        size, kind = _png_size(data), "PNG"
    elif data[:2] == b"BM":
        size, kind = _bmp_size(data), "BMP"
    elif data[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        size, kind = _tiff_size(data), "TIFF"
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        size, kind = _webp_size(data), "WebP"
    else:
        raise DecodeError(f"not a decodable image (no {FORMATS_READ} header)")
    if size is None:
        raise DecodeError(f"not a decodable image (its {kind} header gives no size)")
    if min(size) <= 0:
        raise DecodeError(f"not a decodable image (its {kind} header says {size[1]} x {size[0]} pixels)")
    return size
