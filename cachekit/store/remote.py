"""Object storage transport (``s3://``, ``gs://``, ``memory://`` ... through fsspec).

Only how to reach a URL: which filesystem serves it, with an install hint when its package is
missing. What is read or written there is the business of ``location`` (caches) and of the feed's
shard cache; credentials come from the usual fsspec/boto environment, never from a cache.
"""

from __future__ import annotations

import os

from ..errors import UsageError

__all__ = ["is_url", "filesystem"]


def is_url(path: str | os.PathLike) -> bool:
    """True for ``scheme://...`` locations (``file://`` included), False for plain paths."""
    return "://" in str(path)


def filesystem(url: str):
    """``(fsspec filesystem, path inside it)`` for ``url``, with an install hint when it is missing."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise UsageError(f"{url}: remote caches need fsspec: pip install 'cachekit-vision[remote]'") from None
    try:
        fs, path = url_to_fs(url)
    except ImportError as exc:
        raise UsageError(f"{url}: {exc} (for s3:// pip install 'cachekit-vision[remote]')") from None
    except ValueError as exc:
        raise UsageError(f"{url}: {exc}") from None
    return fs, path.rstrip("/")
