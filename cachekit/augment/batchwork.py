"""One batch's augmentation, drawn once and run by one object: ``BatchWork``.

``Plan.draw_batch`` draws everything a batch takes (each sample's geometry and colour, its pixel
stage, the user's batch ops, MixUp / CutMix) from (seed, epoch, indices) and gives it as one
object that owns the batch: the shape and layout of its output rows; each sample's pixels
(``sample_work``) and masks (``mask``) for the threads over the batch; and its finish, after the
threads: the targets through the same maps (``move``), the rows through the batch ops and the mix
(``finish_rows``), the labels (``labels``), or what the device does instead (``device_work``).
``feed/`` reads rows, runs threads and hands buffers; it decides no pixel and no target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..image.instances import Instances, move_mask
from .batchdraws import Draws
from .devicework import DeviceWork
from .mixing import MixDraws
from .samplework import SampleWork
from .stage import StageDraws
from .userops import BatchOpDraws

__all__ = ["BatchWork"]


@dataclass
class BatchWork:
    """A batch's draws (``draws``: geometry and colour; ``stage``: the per-sample pixel stage;
    ``ops``: the user's batch ops; ``mix``: MixUp / CutMix), where it runs (``on_device``) and the
    smallest share of a box that stays (``min_visibility``)."""

    draws: Draws
    stage: StageDraws | None
    ops: BatchOpDraws | None
    mix: MixDraws | None
    on_device: bool
    channels_last: bool
    min_visibility: float

    @property
    def out_size(self) -> tuple[int, int]:
        return self.draws.out_size

    def rows_last(self, channels: int) -> bool:
        """Whether the threads write the batch channels-last as they augment it (``make_loader(
        channels_last=True)``): crops, resizes and flips write any layout; warps, colour jitter, the
        pixel stage and mixing work on planes, and such a batch is converted once at the end."""
        return (
            self.channels_last
            and not self.on_device
            and channels in (3, 4)
            and self.stage is None
            and self.mix is None
            and self.draws.any_layout
        )

    def source_size(self, ragged: bool) -> tuple[int, int] | None:
        """The device path's padded pixel source size, when it is not the stored images' (``Draws``)."""
        return self.draws.source_size(ragged)

    def sample_work(self, out, heights, widths, source) -> SampleWork:
        """Each sample's pixels into its row of ``out`` (on the threads: and its pixel stage)."""
        return self.draws.sample_work(out, not self.on_device, heights, widths, source, self.stage)

    def extra_rows(self, j: int) -> list[int]:
        """The rows of the read that sample ``j``'s mosaic is built from besides its own."""
        return self.draws.extra_rows(j)

    def mask(self, j: int, maps: list[np.ndarray], row: np.ndarray) -> None:
        """Sample ``j``'s class map into ``row`` (its row of the mask buffer): ``maps`` its own, then
        (a mosaic) its extra rows', through its map, nearest, then through its pixel stage's maps."""
        draws = self.draws
        mask = draws.mask_canvas(j, maps) if len(maps) > 1 else maps[0]
        move_mask(mask, draws.mask_map(j), draws.out_size, row)
        if self.stage is not None:  # RandAugment's shears, translations, rotations
            self.stage.move_mask(row, j)

    def move(self, objects: dict[str, Instances], n: int) -> dict[str, Instances]:
        """Each boxes field's objects (owned by the rows of the read) through their samples' maps, then
        the pixel stage's: boxes clipped and dropped below ``min_visibility`` with their labels and
        points, each object then owned by its sample."""
        moved = {}
        for name, found in objects.items():
            found = self.draws.geometry().move_instances(found, self.min_visibility)
            if self.stage is not None:
                found = self.stage.carry(found, n, self.min_visibility)
            moved[name] = found
        return moved

    def mix_targets(self, objects: dict[str, Instances], masks: dict[str, torch.Tensor], n: int) -> dict:
        """A detection batch's mix: each mixed sample keeps its objects and gains its neighbour's;
        a class map keeps its own classes over its neighbour's (in place)."""
        if self.mix is None:
            return objects
        self.mix.mix_masks(masks)
        return {name: self.mix.mix_objects(found, n) for name, found in objects.items()}

    def finish_rows(self, out: np.ndarray, mixed: Callable[[], np.ndarray], run: Callable) -> np.ndarray:
        """The rows after the threads (the threads path): the batch ops listed before the mix, the
        mix (each row from two rows of ``out`` into a second buffer, ``mixed()``, by ``run(n, fn)``
        over the threads), the batch ops after it. Returns the batch."""
        if self.ops is not None:
            self.ops.apply_rows(out, after=False)
        if self.mix is not None and self.mix.mixes:
            into, src = mixed(), out
            run(len(out), lambda lo, hi: [self.mix.mix_row(src, into, j) for j in range(lo, hi)])
            out = into
        if self.ops is not None:
            self.ops.apply_rows(out, after=True)
        return out

    def labels(self, labels: np.ndarray, num_classes: int | None) -> np.ndarray:
        """The batch's labels: soft, mixed by MixUp / CutMix, on a classification cache."""
        if self.mix is None or self.mix.kind == "detection" or num_classes is None:
            return labels
        return self.mix.soft_labels(labels, num_classes)

    def device_work(self, heights, widths) -> DeviceWork:
        """What the device does to this batch read as stored (``heights``/``widths``: the stored images')."""
        mixes = self.mix if self.mix is not None and self.mix.mixes else None
        return self.draws.device_work(heights, widths, stage=self.stage, batch_ops=self.ops, mix=mixes)
