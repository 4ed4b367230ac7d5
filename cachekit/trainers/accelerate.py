"""Hugging Face Accelerate: ``prepare_loader``, cachekit's loader for one process of an ``Accelerator``.

The loader is left out of ``accelerator.prepare``: ``prepare`` rebuilds every ``DataLoader`` it is
given as its own (``accelerate.data_loader.prepare_data_loader``), from the loader's dataset and
arguments, with a ``BatchSamplerShard`` that deals out the batches of the loader's batch sampler
round the processes. Over ``make_loader``'s sampler, which already gives each process its own
share, every process would then read half of its half (with 2), and the rebuilt loader is a plain
``DataLoader``: per-sample reads instead of batched ones, no read-ahead thread, no augmentation plan
per batch, no exact resume. ``prepare`` is kept for the model and the optimizer; this loader:

- is made once the ``Accelerator`` has started the process group, so each process reads its own
  equal share (``make_loader``'s sampler, a new order every pass, or ``set_epoch``);
- copies batches to the process's CUDA device itself (pinned, side stream, GPU augmentation), as
  ``prepare`` would have; on the CPU it leaves them where they are;
- is registered for checkpointing: ``accelerator.save_state`` keeps its position in the epoch and
  ``load_state`` resumes it at the next batch (the position is global: every process's is the same);
- leaves mixed precision alone: batches come as ``make_loader`` gives them (uint8, or ``dtype=``),
  and ``accelerator.autocast``/``mixed_precision`` apply inside the model as usual.

Accelerate is the ``[accelerate]`` extra, imported when ``prepare_loader`` is called; a version this
module was not written for is refused in one line (``versions.SUPPORTED``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from ..constants import DIST_NAME
from ..errors import UsageError
from ..feed.cacheloader import CacheLoader
from ..feed.dataset import CachedDataset
from ..feed.loader import make_loader
from .versions import check_version

__all__ = ["prepare_loader", "accelerate_module"]


def accelerate_module():
    """``accelerate``, of a version this module supports; otherwise one line saying how to get one."""
    try:  # optional: the [accelerate] extra
        import accelerate
    except ImportError:
        raise UsageError(f"prepare_loader needs accelerate: pip install '{DIST_NAME}[accelerate]'") from None
    check_version("accelerate", accelerate.__version__, f"pip install '{DIST_NAME}[accelerate]'")
    return accelerate


def _check_processes(processes: int) -> None:
    """Refuse, in one line, a loader whose share would not be the Accelerator's: the processes the
    Accelerator trains with must be the process group the loader shares the samples by."""
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world == processes:
        return
    if world == 1:
        raise UsageError(
            f"the Accelerator runs {processes} processes but no process group of them is up: make the "
            "Accelerator first, in every process (accelerate launch or torchrun), then the loader"
        )
    raise UsageError(
        f"a process group of {world} processes is up but the Accelerator trains in {processes}, so each "
        "would read a share and none would synchronise its gradients: on CPUs, Accelerator(cpu=True) "
        "(accelerate launch --cpu)"
    )


def prepare_loader(
    accelerator,
    dataset: str | os.PathLike | CachedDataset,
    batch_size: int,
    *,
    checkpoint: bool = True,
    **options: Any,
) -> CacheLoader:
    """``make_loader(dataset, batch_size, **options)`` for this process of ``accelerator``: its own
    share, batches on its CUDA device (unless ``device=`` says otherwise), and, with ``checkpoint``,
    registered so that ``accelerator.save_state``/``load_state`` keep and resume its position.

    Do not pass the loader to ``accelerator.prepare`` (see this module's docstring for why).
    """
    accelerate = accelerate_module()
    if not isinstance(accelerator, accelerate.Accelerator):
        raise UsageError(f"prepare_loader takes an accelerate.Accelerator, got {type(accelerator).__name__}")
    _check_processes(int(accelerator.num_processes))
    device = accelerator.device
    options.setdefault(
        "device", device if isinstance(device, torch.device) and device.type == "cuda" else None
    )
    loader = make_loader(dataset, batch_size, **options)
    if checkpoint:
        accelerator.register_for_checkpointing(loader)
    return loader
