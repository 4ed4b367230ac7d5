"""Reading one input's bytes: a regular file of bounded size (never a FIFO or device), or a ranged
GET of a URL's file, retried on I/O errors that may be transient.

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

from ...image.ops import DecodeError
from ...store.remote import is_url, process_filesystem

__all__ = ["read_input", "input_reader", "read_retrying"]

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
