"""Reading and checking one raw input: a regular file of bounded size, retried on I/O errors, its
header checked against the pixel limit before it is decoded.

Content problems raise ``DecodeError`` (the build skips the input and says why); I/O errors raise
``OSError`` after a few tries (an unreadable input: skipped and retried by the next build, or
fatal on a dask worker, where a folder some workers do not mount must not look like skips).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..constants import DEFAULT_MAX_PIXELS
from ..image.ops import DecodeError, decode
from ..image.recipes import Pipeline
from ..store.remote import is_url, process_filesystem
from .headers import image_size
from .jpegcheck import decoder_messages, missing_data, structure_problem

__all__ = [
    "read_input",
    "input_reader",
    "read_retrying",
    "decode_input",
    "skip_reason",
    "INPUT_ERRORS",
    "max_input_bytes",
    "jpeg_truncated",
]

#: Tries at reading an input that fails with an I/O error, and the pause before each retry (s).
_READ_TRIES = (0.0, 0.2, 1.0)
#: Errors that retrying does not cure: the file is not there, or not ours to read.
_PERMANENT = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EACCES,
    errno.EPERM,
    errno.ELOOP,
    errno.ENAMETOOLONG,
}


def max_input_bytes(max_pixels: int) -> int:
    """The largest input file a build reads: 8 bytes a pixel (16-bit RGBA, uncompressed) plus 64 MiB."""
    return max_pixels * 8 + (64 << 20) if max_pixels else 0


def jpeg_truncated(data: bytes) -> bool:
    """True when a JPEG's last scan has no end-of-image marker after it (the file was cut short).

    libjpeg decodes such files "successfully" with the missing rows filled grey, so this is checked
    explicitly. An EXIF thumbnail's own end marker comes before the main scan and does not count.
    """
    return data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda")


def read_input(path: Path, max_bytes: int = 0) -> bytes:
    """The bytes of one raw input: a regular file (never a FIFO or device) of at most ``max_bytes``.

    Opened without blocking, then checked on the open file itself, so a file swapped for a FIFO
    after discovery cannot hang the build. Content problems raise DecodeError (a skip).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DecodeError("not a regular file")
        if max_bytes and st.st_size > max_bytes:
            raise DecodeError(f"{st.st_size} bytes, over the {max_bytes}-byte limit (see --max-pixels)")
        chunks, total = [], 0
        while block := os.read(fd, 1 << 24):
            chunks.append(block)
            total += len(block)
            if max_bytes and total > max_bytes:
                raise DecodeError(f"grew past the {max_bytes}-byte limit while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def input_reader(root: str, max_bytes: int, storage_options: dict | None = None) -> Callable[[str], bytes]:
    """``rel -> bytes`` of the inputs under ``root``: a folder, or an fsspec URL (its filesystem made
    in this process, with ``storage_options``)."""
    if is_url(root):
        fs, base = process_filesystem(root, storage_options)

        def read_remote(rel: str) -> bytes:
            if not max_bytes:
                return fs.cat_file(f"{base}/{rel}")
            data = fs.cat_file(f"{base}/{rel}", start=0, end=max_bytes + 1)  # one ranged GET
            if len(data) > max_bytes:
                raise DecodeError(f"over the {max_bytes}-byte limit (see --max-pixels)")
            return data

        return read_remote
    folder = Path(root)
    return lambda rel: read_input(folder / rel, max_bytes)


def read_retrying(read: Callable[[str], bytes], rel: str) -> bytes:
    """``read(rel)``, retried after a pause when an I/O error may be transient (EIO, a timeout)."""
    for attempt, pause in enumerate(_READ_TRIES):
        if pause:  # sleep(0) is a syscall that gives the CPU away on a busy machine (~3 ms a read)
            time.sleep(pause)
        try:
            return read(rel)
        except DecodeError:
            raise
        except MemoryError:
            raise DecodeError("too big to read into memory") from None
        except OSError as exc:
            if exc.errno in _PERMANENT or attempt == len(_READ_TRIES) - 1:
                raise
        except Exception as exc:  # a remote filesystem's own error types: I/O all the same
            if attempt == len(_READ_TRIES) - 1:
                raise OSError(errno.EIO, f"{type(exc).__name__}: {exc}") from None
    raise AssertionError("unreachable")


def _reduce_for(data: bytes, pipeline: Pipeline, hw: tuple[int, int]) -> int:
    """The largest JPEG reduction (2, 4, 8) that keeps the image's short side >= the pipeline's sizes."""
    if pipeline.size is None or not data.startswith(b"\xff\xd8"):
        return 1
    short, need = min(hw), _needed_short_side(pipeline)
    reduce = 1
    while reduce < 8 and short // (reduce * 2) >= need:
        reduce *= 2
    return reduce


def _needed_short_side(pipeline: Pipeline) -> int:
    return max(int(s.params.get("size", 0)) for s in pipeline.steps) if pipeline.steps else 0


def decode_input(
    data: bytes | np.ndarray,
    pipeline: Pipeline,
    *,
    fast_decode: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    check_recipe: bool = True,
    listen: bool = True,
) -> np.ndarray:
    """Decode one raw input's bytes as a build does; DecodeError (saying why) for what a build skips.

    The header is checked against ``max_pixels`` (0: no limit) before anything is decoded, for the
    input and, with ``check_recipe``, for the largest image ``pipeline`` will make of it. A JPEG
    whose structure or decoder says data is missing (cut short, even with an end marker added) is
    a skip (``jpegcheck``); ``listen=False`` skips hearing the decoder (for timing loops over
    inputs already checked: the hearing takes turns between threads).
    """
    if isinstance(data, np.ndarray):  # pixels from code (``samples``): nothing to decode
        h, w = data.shape[:2]
    elif not data:
        raise DecodeError("empty file")
    else:
        h, w = image_size(data)
    if max_pixels:
        if h * w > max_pixels:
            raise DecodeError(f"{w} x {h} pixels, over the --max-pixels limit of {max_pixels}")
        peak = pipeline.peak_pixels(h, w)
        if check_recipe and peak > max_pixels:
            raise DecodeError(
                f"{w} x {h} pixels would become {peak} in the recipe, over the --max-pixels "
                f"limit of {max_pixels} (an extreme aspect ratio)"
            )
    if isinstance(data, np.ndarray):
        return data
    reduce = _reduce_for(data, pipeline, (h, w)) if fast_decode else 1
    if not data.startswith(b"\xff\xd8"):
        return decode(data, reduce=reduce)
    if jpeg_truncated(data):
        raise DecodeError("truncated JPEG (no end-of-image marker)")
    problem = structure_problem(data)
    if problem:
        raise DecodeError(problem)
    if not listen:
        return decode(data, reduce=reduce)
    with decoder_messages() as said:
        img = decode(data, reduce=reduce)
    problem = missing_data(said())
    if problem:
        raise DecodeError(problem)
    return img


#: What reading, decoding or preprocessing one input may raise and still be only that input's
#: problem: anything (an OpenCV error, running out of memory on a bomb, a ValueError), so a build
#: skips it with ``skip_reason`` and goes on. ``cachekit bench`` skips the same inputs.
INPUT_ERRORS: tuple[type[Exception], ...] = (Exception,)


def skip_reason(exc: BaseException) -> str:
    """The reason a build records for an input whose reading, decoding or preprocessing raised ``exc``."""
    if isinstance(exc, DecodeError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"unreadable: {exc.strerror or exc}"
    if isinstance(exc, MemoryError):
        return "out of memory while decoding or preprocessing it"
    text = " ".join(str(exc).split())[:200]
    if type(exc).__module__ == "cv2" or type(exc).__name__ == "error":
        return f"OpenCV failed on it ({text})"
    return f"{type(exc).__name__} while decoding or preprocessing it ({text})"
