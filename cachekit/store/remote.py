"""Object storage transport (``s3://``, ``gs://``, ``memory://`` ... through fsspec).

Only how to reach a URL: which filesystem serves it, with an install hint when its package is
missing. What is read or written there is the business of ``location`` (caches) and of the feed's
shard cache; credentials come from the usual fsspec/boto environment, never from a cache.
"""

from __future__ import annotations

import os

from ..errors import UsageError

__all__ = ["is_url", "filesystem", "parse_storage_options"]


def is_url(path: str | os.PathLike) -> bool:
    """True for ``scheme://...`` locations (``file://`` included), False for plain paths."""
    return "://" in str(path)


def filesystem(url: str, storage_options: dict | None = None, *, fresh: bool = False):
    """``(fsspec filesystem, path inside it)`` for ``url``, with an install hint when it is missing.

    ``storage_options`` go to the filesystem (``endpoint_url``, ``key``, ``anon``, ...), never into a
    cache or a log. ``fresh``: a new instance rather than fsspec's cached one; a process must not use
    an instance made before it was forked (s3fs's event loop and sessions are not fork-safe).
    """
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise UsageError(f"{url}: remote caches need fsspec: pip install 'cachekit-vision[remote]'") from None
    options = dict(storage_options or {})
    if fresh:
        options["skip_instance_cache"] = True
    try:
        fs, path = url_to_fs(url, **options)
    except ImportError as exc:
        raise UsageError(f"{url}: {exc} (for s3:// pip install 'cachekit-vision[remote]')") from None
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{url}: {exc}") from None
    return fs, path.rstrip("/")


def parse_storage_options(pairs) -> dict:
    """``["endpoint_url=http://...", "anon=true"]`` (the CLI's ``--storage-option``) as a dict;
    ``true``/``false`` and integers become such, the rest stay strings."""
    options: dict = {}
    for pair in pairs or ():
        key, sep, value = str(pair).partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--storage-option {pair!r}: expected KEY=VALUE")
        low = value.strip().lower()
        options[key.strip()] = (
            True if low == "true" else False if low == "false" else int(low) if low.isdigit() else value
        )
    return options
