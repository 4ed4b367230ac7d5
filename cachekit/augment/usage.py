"""The errors an augment list is refused with, at the bottom of the augment wing (the user's own ops,
the plan and the spec parser raise them; ``mistakes`` says what a wrong item in a list is)."""

from __future__ import annotations

from ..errors import UsageError

__all__ = ["AugmentUsageError", "AugmentTypeError"]


class AugmentUsageError(UsageError, ValueError):
    """An augment list written so that it would not run as written (or a class where an instance
    belongs, or a user's op that failed on a sample): one line that says the fix. A ``UsageError``
    (exit 2), and a ``ValueError`` as every other refusal of a list is."""


class AugmentTypeError(AugmentUsageError, TypeError):
    """Something other than a transform where a transform belongs (a container, a function, a name,
    another library's transform): the one line of an ``AugmentUsageError``, and a ``TypeError`` as
    the refusal of a wrong kind of step has always been."""
