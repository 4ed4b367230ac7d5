"""A build's sources: one module per source kind, each behind ``base.SourceKind`` (discover ->
records -> samples), and ``layouts.LAYOUTS``, the one table of layouts that discovery, splits,
class names, ``bench`` and the build read. Everything a source needs is in this package, or in
``image`` and ``store``: nothing in it imports the build above it (``findsource``, ``run``, ...).

``Source`` (the table of a build's inputs) and ``discover`` (a folder's inputs) are the public names.
"""

from __future__ import annotations

from .inputtable import Source

__all__ = ["Source", "discover"]


def __getattr__(name: str):
    if name == "discover":  # loaded on first use: discovery imports every kind's rules
        from . import discovery

        return getattr(discovery, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
