"""``text``: a UTF-8 string per sample (a caption), ragged bytes."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import CacheError
from .base import RaggedKind

__all__ = ["TextKind"]


class TextKind(RaggedKind):
    kind = "text"
    part, dtype = "utf8", "|u1"

    def encode(self, value: Any, params: dict) -> np.ndarray:
        return np.frombuffer(str(value).encode("utf-8"), dtype=np.uint8)

    def decode(self, name: str, stored: np.ndarray) -> str:
        try:
            # decoded from the gathered bytes themselves (no copy of them first: a caption may be large)
            return str(np.ascontiguousarray(stored, dtype=np.uint8).data, "utf-8")
        except UnicodeDecodeError:
            raise CacheError(f"{name!r}: a stored text is not UTF-8 (the shard is damaged)") from None
