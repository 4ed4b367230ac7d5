"""``boxes``: each sample's objects as float32 ``[N, 4]`` boxes (x1, y1, x2, y2) in the stored image's
pixels, with int64 ``classes`` (indices into ``ds.classes``) and uint8 ``iscrowd`` (COCO's flag: 1
for a box around a crowd, which evaluation ignores); ``N`` varies from sample to sample.

Coordinates are continuous, with pixel ``i`` covering ``[i, i + 1)``, as COCO's are: a box round a
whole ``W``-wide image is ``[0, 0, W, H]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import (
    Column,
    ColumnReader,
    FieldKind,
    ShardRows,
    column_name,
    pack_ragged,
    ragged_gather,
    row_spans,
)

__all__ = ["BoxesKind", "empty_boxes"]

_PARTS = {"boxes": ((4,), "<f4"), "classes": ((), "<i8"), "iscrowd": ((), "|u1")}


def empty_boxes() -> dict[str, np.ndarray]:
    """A sample with no objects."""
    return {
        "boxes": np.zeros((0, 4), dtype=np.float32),
        "classes": np.zeros(0, dtype=np.int64),
        "iscrowd": np.zeros(0, dtype=np.uint8),
    }


class BoxesKind(FieldKind):
    kind = "boxes"

    def columns(self, name: str, params: dict) -> dict[str, Column]:
        out = {
            column_name(name, part): Column(shape, dtype, ragged=True)
            for part, (shape, dtype) in _PARTS.items()
        }
        out[column_name(name, "offsets")] = Column((), "<i8")
        return out

    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        out = {}
        offsets = None
        for part, (shape, dtype) in _PARTS.items():
            data, offsets = pack_ragged([v[part] for v in values], dtype, shape)
            out[column_name(name, part)] = data
        out[column_name(name, "offsets")] = offsets
        return out

    def gather(
        self, name: str, column: ColumnReader, rows: Sequence[int], samples: int, memo: dict | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``(counts, parts)``: each row's number of boxes, and the rows' ``boxes``, ``classes`` and
        ``iscrowd`` back to back (fresh arrays): a batch's boxes as one set of arrays."""
        counts, (b, c, k) = ragged_gather(
            column,
            column_name(name, "boxes"),
            column_name(name, "offsets"),
            rows,
            samples,
            extra=(column_name(name, "classes"), column_name(name, "iscrowd")),
            memo=memo,
        )
        parts = {
            "boxes": np.asarray(b, dtype=np.float32).reshape(-1, 4),
            "classes": np.asarray(c, dtype=np.int64),
            "iscrowd": np.asarray(k, dtype=np.uint8),
        }
        return counts, parts

    def read(self, name: str, params: dict, shard: ShardRows) -> list:
        counts, parts = self.gather(name, shard.column, shard.rows, shard.samples, shard.memo)
        return [{k: v[a:b] for k, v in parts.items()} for a, b in row_spans(counts)]
