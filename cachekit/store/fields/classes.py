"""``label`` (one class per sample) and ``labels`` (any number of classes per sample: multi-label).

A ``label`` field is the shard's ``labels`` column itself, which every cache has (-1: none): a
classification cache and a cache with boxes read the same class the same way. ``labels`` keeps
each sample's class indices (into ``ds.classes``), sorted and without repeats, as a ragged column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Column, FieldKind, RaggedKind, ShardRows

__all__ = ["LabelKind", "LabelsKind"]


class LabelKind(FieldKind):
    kind = "label"

    def columns(self, name: str, params: dict) -> dict[str, Column]:
        return {}  # the ``labels`` column every shard has

    def pack(self, name: str, params: dict, values: Sequence) -> dict[str, np.ndarray]:
        return {}

    def read(self, name: str, params: dict, shard: ShardRows) -> list:
        return [int(v) for v in shard.take("labels")]


class LabelsKind(RaggedKind):
    kind = "labels"
    part, dtype = "values", "<i8"

    def encode(self, value: Any, params: dict) -> np.ndarray:
        return np.unique(np.asarray(value, dtype=np.int64))  # sorted, without repeats

    def decode(self, name: str, stored: np.ndarray) -> np.ndarray:
        return np.asarray(stored, dtype=np.int64)  # a view of the gathered copy
