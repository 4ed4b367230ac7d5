"""Exceptions a user can act on; the CLI prints them as one line and exits with their ``exit_code``.

Exit codes: 0 ok; 1 a problem found in a cache or a build (a damaged shard or manifest, inputs
skipped under ``--strict``, a write that failed); 2 a usage error the user can fix, including a
path that is not a cache at all; 130 interrupted.
"""

from __future__ import annotations

import re

__all__ = ["CachekitError", "CacheError", "NotACacheError", "BuildError", "UsageError", "hide_userinfo"]

#: ``user:password@host`` of a URL: after its ``scheme://``, or, where a library quoted the URL
#: without its scheme (``"user:password@bucket"``), after a quote, a space or the start of the text
#: and before a host name of three characters or more (``ratio 3:4@2x`` is left alone).
_USERINFO = re.compile(
    r"(?P<before>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s\"']*):(?P<password>[^/@\s\"']+)@(?=[^\s@])"
    r"|(?P<before2>^|(?<=[\s\"'(=]))(?P<user2>[^/@:\s\"']+):(?P<password2>[^/@\s\"']+)@(?=[A-Za-z0-9][A-Za-z0-9.-]{2,})"
)


def hide_userinfo(text: str) -> str:
    """``text`` with the password of any ``user:password@host`` in it replaced by ``***``."""

    def hidden(m: re.Match) -> str:
        if m["before"] is not None:
            return f"{m['before']}{m['user']}:***@"
        return f"{m['before2']}{m['user2']}:***@"

    return _USERINFO.sub(hidden, text)


class CachekitError(Exception):
    """Base class: a problem with a clear cause, reported without a traceback.

    Its message never shows the password of a URL (``s3://user:password@...``).
    """

    exit_code = 1

    def __str__(self) -> str:
        return hide_userinfo(super().__str__())


class CacheError(CachekitError):
    """A cache folder is missing, incomplete, corrupted or refuses to be trusted."""


class NotACacheError(CacheError):
    """The path is not a cache at all (missing, not a folder, no manifest, someone else's manifest).

    A usage error (exit 2): the command was pointed at the wrong place. A cache whose manifest is
    there but damaged or of another format version is a CacheError (exit 1): it needs a rebuild.
    """

    exit_code = 2


class BuildError(CachekitError):
    """A build failed for a reason outside the inputs' control (disk full, write error, ...)."""


class UsageError(CachekitError):
    """Bad arguments or inputs the user can fix (missing folder, unknown pipeline, ...)."""

    exit_code = 2
