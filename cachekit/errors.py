"""Exceptions a user can act on; the CLI prints them as one line."""

from __future__ import annotations

__all__ = ["CachekitError", "CacheError", "BuildError", "UsageError"]


class CachekitError(Exception):
    """Base class: a problem with a clear cause, reported without a traceback."""

    exit_code = 1


class CacheError(CachekitError):
    """A cache folder is missing, incomplete, corrupted or refuses to be trusted."""


class BuildError(CachekitError):
    """A build failed for a reason outside the inputs' control (disk full, write error, ...)."""


class UsageError(CachekitError):
    """Bad arguments or inputs the user can fix (missing folder, unknown pipeline, ...)."""

    exit_code = 2
