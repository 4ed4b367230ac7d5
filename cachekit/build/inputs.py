"""Checking and decoding one raw input's bytes (read by ``sources.reading``): its header checked
against the pixel limit before it is decoded, a JPEG cut short refused, and the reason a build
records for an input it skips.

Content problems raise ``DecodeError`` (the build skips the input and says why).
"""

from __future__ import annotations

import numpy as np

from ..constants import DEFAULT_MAX_PIXELS
from ..image.ops import DecodeError, decode
from ..image.recipes import Pipeline
from .headers import image_size
from .jpegcheck import decoder_messages, missing_data, structure_problem

__all__ = [
    "decode_input",
    "skip_reason",
    "INPUT_ERRORS",
    "max_input_bytes",
    "jpeg_truncated",
]


def max_input_bytes(max_pixels: int) -> int:
    """The largest input file a build reads: 8 bytes a pixel (16-bit RGBA, uncompressed) plus 64 MiB."""
    return max_pixels * 8 + (64 << 20) if max_pixels else 0


def jpeg_truncated(data: bytes) -> bool:
    """True when a JPEG's last scan has no end-of-image marker after it (the file was cut short).

    libjpeg decodes such files "successfully" with the missing rows filled grey, so this is checked
    explicitly. An EXIF thumbnail's own end marker comes before the main scan and does not count.
    """
    return data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda")


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
