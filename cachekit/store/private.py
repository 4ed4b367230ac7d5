"""Private folders, and files opened without following links: what cachekit keeps on a shared machine.

A folder another user may write in (owned by someone else, or writable by its group or by others)
could be made to hold links or swapped files before cachekit looks, so cachekit keeps nothing
there: ``private_folder`` makes a missing folder (and its missing parents) mode 0700 and refuses,
in one line, a folder that is not the user's own. Inside it every file cachekit creates, appends
to or locks is opened with ``O_NOFOLLOW`` and ``O_CLOEXEC`` and must be a regular file (a link
planted in its place fails instead of leading elsewhere); a whole file (a marker, a record) is
written under a unique temp name and renamed into place, which replaces a link rather than
writing through it. The folders above it must be root's or the user's, and writable by others only
with the sticky bit (``/tmp``), so nobody can swap the folder between two checks. Modes and owners
are read, never inferred from access checks: root passes every access check, and is still refused
a folder another user owns.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

from ..errors import UsageError

__all__ = [
    "private_folder",
    "check_private",
    "open_nofollow",
    "replace_file",
    "append_line",
    "read_nofollow",
    "NOFOLLOW",
]

#: Flags that make ``os.open`` refuse a symlink as the last component and keep the descriptor
#: out of child processes (0 where the platform has none).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def check_private(path: Path, what: str) -> None:
    """Raise UsageError unless ``path`` is a folder of this user that nobody else may write in.

    A link as ``path`` itself (the user's own choice of folder) is followed, but the link must be
    this user's or root's: a link someone else planted in a shared folder is refused.
    """
    me = os.geteuid()
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be used: {exc.strerror or exc}") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise UsageError(
            f"{what} {path} is a link owned by uid {link.st_uid}, not by you (uid {me}): another user "
            "chose where it leads; use a folder of your own"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path} is not a folder")
    if st.st_uid != me:
        raise UsageError(
            f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {me}): its owner could change "
            "what cachekit reads there; use a folder of your own"
        )
    if st.st_mode & 0o022:
        who = " and ".join(n for n, bit in (("its group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        raise UsageError(
            f"{what} {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}): another user could "
            f"plant files there; chmod go-w {path}, or use a folder of your own"
        )
    if st.st_mode & 0o700 != 0o700:
        raise UsageError(
            f"{what} {path} is not readable, writable and searchable by you (mode "
            f"{stat.S_IMODE(st.st_mode):o}); chmod u+rwx it, or use another folder"
        )
    _check_ancestors(Path(os.path.realpath(path)), what, path)
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    if read_only:
        raise UsageError(f"{what} {path} is on a read-only filesystem; use a writable folder")


def _check_ancestors(real: Path, what: str, path: Path) -> None:
    """Every folder above ``real`` must be root's or this user's, and writable by others only with
    the sticky bit (as ``/tmp``): else another user could rename the private folder away and put
    one of their own in its place between two checks."""
    me = os.geteuid()
    for parent in real.parents:
        try:
            st = os.stat(parent)
        except OSError:
            continue
        if st.st_uid not in (0, me):
            raise UsageError(
                f"{what} {path} is inside {parent}, which uid {st.st_uid} owns: they could put a folder "
                "of their own in its place; use a folder under one of your own or root's"
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UsageError(
                f"{what} {path} is inside {parent}, which others may write in (mode "
                f"{stat.S_IMODE(st.st_mode):o}, no sticky bit): they could put a folder of their own in "
                "its place; use a folder under one of your own"
            )


def private_folder(path: Path, what: str) -> Path:
    """``path``, made mode 0700 when missing (its missing parents too), then ``check_private``ed."""
    path = Path(path)
    missing = []
    for folder in [path, *path.parents]:
        if os.path.lexists(folder):
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # another process made it meanwhile: checked below like any other
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                raise UsageError(f"{what} {path} cannot be made: a file is in the way") from None
            raise UsageError(f"{what} {path} cannot be made: {exc.strerror or exc}") from None
    check_private(path, what)
    return path


def open_nofollow(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symlink (``ELOOP``) and anything but a regular file (``EINVAL``).

    Opened non-blocking, so that a FIFO planted in the file's place cannot hang the call.
    """
    fd = os.open(path, flags | NOFOLLOW | getattr(os, "O_NONBLOCK", 0), mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_file(path: Path, data: bytes) -> None:
    """Put a file holding ``data`` at ``path``: written under a unique temp name, renamed into place.

    The rename replaces whatever entry was there (a link included) and never writes through it.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_nofollow(path: Path, limit: int = 1 << 24) -> bytes | None:
    """The first ``limit`` bytes of the regular file at ``path``, or None when it is missing,
    a link or not a regular file."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks, total = [], 0
        while total < limit and (block := os.read(fd, min(1 << 20, limit - total))):
            chunks.append(block)
            total += len(block)
        return b"".join(chunks)
    finally:
        os.close(fd)


def append_line(path: Path, line: str, max_bytes: int) -> None:
    """Append ``line`` to the log at ``path``; past ``max_bytes`` its older half is dropped.

    A link or other non-file in the log's place is removed (the entry, never what it leads to)
    and the log started afresh.
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:
        fd = open_nofollow(path, flags)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EINVAL, errno.ENXIO):
            raise
        os.unlink(path)
        fd = open_nofollow(path, flags | os.O_EXCL)
    try:
        _write_all(fd, line.encode())
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > max_bytes:
        lines = (read_nofollow(path, 2 * max_bytes) or b"").splitlines(keepends=True)
        replace_file(path, b"".join(lines[len(lines) // 2 :]))
