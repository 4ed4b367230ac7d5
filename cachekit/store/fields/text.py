"""``text``: a UTF-8 string per sample (a caption), ragged bytes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import CacheError
from .base import Column, ColumnReader, column_name, pack_ragged, ragged_rows

__all__ = ["TextKind"]


class TextKind:
    kind = "text"

    def check_params(self, params: dict, where: str) -> dict:
        return {}

    def columns(self, name: str, params: dict) -> dict[str, Column]:
        return {
            column_name(name, "utf8"): Column((), "|u1", ragged=True),
            column_name(name, "offsets"): Column((), "<i8"),
        }

    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        blobs = [np.frombuffer(str(v).encode("utf-8"), dtype=np.uint8) for v in values]
        data, offsets = pack_ragged(blobs, "|u1")
        return {column_name(name, "utf8"): data, column_name(name, "offsets"): offsets}

    def unpack(
        self,
        name: str,
        params: dict,
        column: ColumnReader,
        rows: Sequence[int],
        samples: int,
        memo: dict | None = None,
    ) -> list:
        found = ragged_rows(
            column, column_name(name, "utf8"), column_name(name, "offsets"), rows, samples, memo=memo
        )
        try:
            # decoded from the gathered bytes themselves (no copy of them first: a caption may be large)
            return [str(np.ascontiguousarray(v, dtype=np.uint8).data, "utf-8") for (v,) in found]
        except UnicodeDecodeError:
            raise CacheError(f"{name!r}: a stored text is not UTF-8 (the shard is damaged)") from None
