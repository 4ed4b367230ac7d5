"""Bounds on everything a manifest states, and its nesting, so that no hostile value reaches arithmetic.

Each bound is far above any real cache and far below what overflows int64 arithmetic or asks numpy
for an impossible allocation; a manifest past one is refused whole, with a CacheError naming the
field.
"""

from __future__ import annotations

from typing import Any

from ..errors import CacheError

__all__ = [
    "MAX_SAMPLES",
    "MAX_SHARD_ROWS",
    "MAX_SHARD_BYTES",
    "MAX_SAMPLE_BYTES",
    "MAX_EXTRA_BYTES",
    "MAX_EXTRAS",
    "MAX_ARRAY_BYTES",
    "MAX_CLASSES",
    "MAX_VARIANTS",
    "MAX_DEPTH",
    "MAX_MANIFEST_BYTES",
    "MAX_INT",
    "check_depth",
    "short",
]

#: Samples in one cache (LAION-5B has ~2**32).
MAX_SAMPLES = 2**40
#: Rows (samples) or inputs in one shard.
MAX_SHARD_ROWS = 2**31 - 1
#: Bytes of one shard file or folder.
MAX_SHARD_BYTES = 2**48
#: Bytes of one image (channels x height x width); a 16k x 16k RGB image is 2**29.5.
MAX_SAMPLE_BYTES = 2**31
#: Bytes of one per-sample extra, and how many extras a sample may have.
MAX_EXTRA_BYTES = 2**20
MAX_EXTRAS = 64
#: Bytes of one sample's array field (a fixed shape's, or what a build reads of one ``.npy``).
MAX_ARRAY_BYTES = 64 * 2**20
#: Classes a cache may name (a class index in an annotation past this is a bad row, not a list of
#: a billion names).
MAX_CLASSES = 2**20
#: Offline-augmented variants per input.
MAX_VARIANTS = 2**16
#: Nesting of JSON arrays and objects (the manifest itself needs 5).
MAX_DEPTH = 32
#: Size of manifest.json (an ImageNet cache's is ~1 MB).
MAX_MANIFEST_BYTES = 1 << 30
#: Any other integer field.
MAX_INT = 2**62


def short(value: Any) -> str:
    """``repr(value)`` cut to a readable length (a hostile field may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def check_depth(obj: Any, where: str) -> None:
    """Raise CacheError if JSON arrays and objects nest deeper than MAX_DEPTH (walked without recursion).

    Whatever later walks the manifest recursively (``json.dumps``, equality, a report) then stays
    far from Python's recursion limit.
    """
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise CacheError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)
