"""``label`` (one class per sample) and ``labels`` (any number of classes per sample: multi-label).

A ``label`` field is the shard's ``labels`` column itself, which every cache has (-1: none): a
classification cache and a cache with boxes read the same class the same way. ``labels`` keeps
each sample's class indices (into ``ds.classes``), sorted and without repeats, as a ragged column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import Column, ColumnReader, column_name, pack_ragged, ragged_rows

__all__ = ["LabelKind", "LabelsKind"]


class LabelKind:
    kind = "label"

    def check_params(self, params: dict, where: str) -> dict:
        return {}

    def columns(self, name: str, params: dict) -> dict[str, Column]:
        return {}  # the ``labels`` column every shard has

    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        return {}

    def unpack(
        self,
        name: str,
        params: dict,
        column: ColumnReader,
        rows: Sequence[int],
        samples: int,
        memo: dict | None = None,
    ) -> list:
        labels = np.asarray(column("labels", np.asarray(rows, dtype=np.int64)))
        return [int(v) for v in labels]


class LabelsKind:
    kind = "labels"

    def check_params(self, params: dict, where: str) -> dict:
        return {}

    def columns(self, name: str, params: dict) -> dict[str, Column]:
        return {
            column_name(name, "values"): Column((), "<i8", ragged=True),
            column_name(name, "offsets"): Column((), "<i8"),
        }

    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        data, offsets = pack_ragged([np.unique(np.asarray(v, dtype=np.int64)) for v in values], "<i8")
        return {column_name(name, "values"): data, column_name(name, "offsets"): offsets}

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
            column, column_name(name, "values"), column_name(name, "offsets"), rows, samples, memo=memo
        )
        return [np.asarray(v, dtype=np.int64) for (v,) in found]  # views of ragged_rows' own copy
