"""How long a loader waits for a batch, and the error that says it waited too long."""

from __future__ import annotations

from ..errors import CachekitError

__all__ = ["READ_TIMEOUT_SECONDS", "ReadTimeout"]

#: The longest a loader waits for one batch (from its prefetch thread, its threads over a batch or
#: its worker processes) before it gives up in one line: a read that takes longer is stuck, never
#: merely slow (shards on object storage come in replies bounded by ``CACHEKIT_REMOTE_TIMEOUT`` each).
READ_TIMEOUT_SECONDS = 600.0


class ReadTimeout(CachekitError, TimeoutError):
    """A loader waited longer than its bound for a batch: what it waited on is named."""
