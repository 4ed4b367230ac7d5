"""Exceptions a user can act on; the CLI prints them as one line and exits with their ``exit_code``.

Exit codes: 0 ok; 1 a problem found in a cache or a build (a damaged shard or manifest, inputs
skipped under ``--strict``, a write that failed); 2 a usage error the user can fix, including a
path that is not a cache at all; 130 interrupted.
"""

from __future__ import annotations

__all__ = ["CachekitError", "CacheError", "NotACacheError", "BuildError", "UsageError"]


class CachekitError(Exception):
    """Base class: a problem with a clear cause, reported without a traceback."""

    exit_code = 1


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
