"""A Lightning DDP run over ``CacheDataModule``, recording what each rank saw (run by test_lightning.py).

    python lightning_job.py SPLITS OUT [--epochs N] [--ckpt-every K] [--resume CKPT] [--estimate-steps]

Lightning's ``strategy="ddp"`` starts the other ranks by running this script again, as it would a
user's. Each rank appends one JSON line per training and validation batch to ``OUT/rank<r>.jsonl``:
the stage, the epoch, the batch's index, the sampler's epoch, the labels (each sample of the test
caches has its own class, so a label names its sample) and a digest of each augmented image.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from cachekit.trainers.lightning import CacheDataModule
from cachekit.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop


def digest(image: torch.Tensor) -> str:
    return hashlib.blake2b(image.contiguous().numpy().tobytes(), digest_size=8).hexdigest()


class Recorder(L.LightningModule):
    def __init__(self, out: str, estimate: bool = False) -> None:
        super().__init__()
        self.out, self.estimate = out, estimate
        self.net = torch.nn.Linear(3, 4)

    def _record(self, stage: str, batch, batch_idx: int) -> None:
        images, labels = batch
        row = {
            "stage": stage,
            "epoch": self.current_epoch,
            "step": batch_idx,
            "labels": labels.tolist(),
            "images": [digest(x) for x in images],
            "size": list(images.shape[-2:]),
        }
        if stage == "train":
            row["sampler_epoch"] = self.trainer.train_dataloader.sampler.epoch
        with open(os.path.join(self.out, f"rank{self.global_rank}.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")

    def training_step(self, batch, batch_idx):
        self._record("train", batch, batch_idx)
        return self.net(batch[0].float().mean((2, 3))).sum()

    def validation_step(self, batch, batch_idx):
        self._record("val", batch, batch_idx)

    def configure_optimizers(self):
        if self.estimate:  # as a learning-rate schedule would: Lightning makes the loader early then
            assert self.trainer.estimated_stepping_batches == 15
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("splits")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--estimate-steps", action="store_true")
    args = parser.parse_args()
    L.seed_everything(7, verbose=False)
    data = CacheDataModule(
        args.splits,
        batch_size=4,
        augment=[RandomResizedCrop(24), RandomHorizontalFlip()],
        val_augment=[CenterCrop(16)],
        val_batch_size=2,
    )
    callbacks = []
    if args.ckpt_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=args.ckpt_every, save_top_k=-1,
                filename="{step}",
            )
        )  # fmt: skip
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Recorder(args.out, args.estimate_steps), data, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
