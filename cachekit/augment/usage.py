"""The one-line refusal of an augment list, shared by the plan, the spec parser and the user's own ops."""

from __future__ import annotations

from ..errors import UsageError

__all__ = ["AugmentUsageError"]


class AugmentUsageError(UsageError, ValueError):
    """An augment list written so that it would not run as written (or a class where an instance
    belongs, or a user's op that failed on a sample): one line that says the fix. A ``UsageError``
    (exit 2), and a ``ValueError`` as every other refusal of a list is."""
