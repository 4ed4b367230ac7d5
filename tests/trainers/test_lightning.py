"""CacheDataModule under Lightning's own Trainer: DDP ranks read their own shares, each epoch anew, and a
checkpoint saved mid-epoch resumes in a new process with exactly the batches the uninterrupted run read."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from conftest import HERE, SPLITS, run_job

from cachekit.constants import DIST_NAME
from cachekit.errors import NotACacheError, UsageError

L = pytest.importorskip("lightning")

JOB = str(HERE / "lightning_job.py")
#: The job's shape: 40 training samples, 2 ranks, batches of 4 -> 5 steps an epoch; 16 validation
#: samples in batches of 2 -> 4 an epoch per rank; a checkpoint at global step 7 is batch 2 of epoch 1.
EPOCHS, STEPS, CHECKPOINT_STEP = 3, 5, 7


def _rows(out: Path) -> dict[int, list[dict]]:
    return {
        r: [json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)
    }


def _seen(rows: dict[int, list[dict]], stage: str) -> dict[int, dict[int, list[int]]]:
    """epoch -> rank -> the labels that rank's batches of ``stage`` held, in order."""
    seen: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rank, lines in rows.items():
        for row in lines:
            if row["stage"] == stage:
                seen[row["epoch"]][rank] += row["labels"]
    return seen


@pytest.mark.slow
def test_ddp_ranks_read_their_shares_anew_each_epoch_and_a_mid_epoch_checkpoint_resumes_exactly(
    numbered, tmp_path
):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir(), resumed.mkdir()
    run_job(
        [JOB, str(numbered), str(full), "--epochs", str(EPOCHS), "--ckpt-every", str(CHECKPOINT_STEP)], full
    )
    rows = _rows(full)

    train = _seen(rows, "train")
    assert sorted(train) == list(range(EPOCHS))
    for ranks in train.values():  # every training sample exactly once an epoch, half on each rank
        assert len(ranks[0]) == len(ranks[1]) == SPLITS["train"] // 2
        assert sorted(ranks[0] + ranks[1]) == list(range(SPLITS["train"]))
    assert train[0][0] != train[1][0] and train[1][0] != train[2][0]  # a new order every epoch
    for lines in rows.values():  # the trainer set each epoch on the loader's own sampler
        assert {(r["epoch"], r["sampler_epoch"]) for r in lines if r["stage"] == "train"} == {
            (e, e) for e in range(EPOCHS)
        }
        assert {tuple(r["size"]) for r in lines} == {(24, 24), (16, 16)}  # train and val transforms
        assert {tuple(r["size"]) for r in lines if r["stage"] == "val"} == {(16, 16)}
    val = _seen(rows, "val")
    for ranks in val.values():  # every validation sample once, in the same order each epoch
        assert sorted(ranks[0] + ranks[1]) == list(range(SPLITS["val"])) and ranks == val[0]

    checkpoint = full / "ckpt" / f"step={CHECKPOINT_STEP}.ckpt"
    saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert [(s["epoch"], s["position"]) for s in saved] == [(1, 16)]  # 2 batches of 4 on each of 2 ranks
    run_job([JOB, str(numbered), str(resumed), "--epochs", str(EPOCHS), "--resume", str(checkpoint)], resumed)
    again = _rows(resumed)
    for rank in (0, 1):  # the resumed run reads exactly what the whole one read after the checkpoint
        after = [r for r in rows[rank] if (r["epoch"], r["stage"] == "val", r["step"]) >= (1, False, 2)]
        assert again[rank][0]["stage"] == "train" and (again[rank][0]["epoch"], again[rank][0]["step"]) == (
            1,
            2,
        )
        assert again[rank] == after


def test_one_process_reads_a_single_cache_with_no_validation(numbered, tmp_path):
    from cachekit.trainers.lightning import CacheDataModule

    class Count(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.labels = torch.nn.Linear(3, 2), []

        def training_step(self, batch, batch_idx):
            self.labels += batch[1].tolist()
            return self.net(batch[0].float().mean((2, 3))).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = CacheDataModule(numbered / "train", batch_size=8, seed=4)
    assert data.caches == {"train": str(numbered / "train"), "val": None, "test": None}
    model = Count()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, data)
    assert sorted(model.labels) == sorted(2 * list(range(SPLITS["train"])))
    assert model.labels[:40] != model.labels[40:]  # epoch 2 in a new order
    assert type(trainer.train_dataloader).__name__ == "CacheLoader" and trainer.num_val_batches == []


def test_bad_input_is_one_line(numbered, monkeypatch):
    from cachekit.trainers.lightning import CacheDataModule, lightning_pytorch, split_caches
    from cachekit.trainers.versions import check_version

    assert split_caches(numbered) == {
        "train": str(numbered / "train"),
        "val": str(numbered / "val"),
        "test": None,
    }
    with pytest.raises(NotACacheError) as exc:
        CacheDataModule(numbered, batch_size=4, val="valid")
    assert str(exc.value) == f"{numbered}: no split 'valid' (holds the splits train, val)"
    with pytest.raises(UsageError, match="is one cache, not a folder of splits"):
        CacheDataModule(numbered / "train", batch_size=4, val="val")
    with pytest.raises(UsageError, match="sets shuffle= itself"):
        CacheDataModule(numbered, batch_size=4, shuffle=False)
    with pytest.raises(UsageError, match="needs a folder of split caches, or train="):
        CacheDataModule(batch_size=4)
    with pytest.raises(UsageError) as old:
        check_version("lightning", "1.9.5", f"pip install '{DIST_NAME}[lightning]'")
    assert str(old.value) == (
        f"cachekit's lightning adapter needs lightning from 2.2 to before 3.0, found 1.9.5: "
        f"pip install '{DIST_NAME}[lightning]'"
    )
    check_version("lightning", L.__version__, "")
    monkeypatch.setattr(L, "__version__", "3.1.0")  # the installed Lightning, as a version not supported
    with pytest.raises(
        UsageError, match=r"^cachekit's lightning adapter needs lightning from 2.2 to before 3.0, found 3.1.0"
    ):
        lightning_pytorch()  # what CacheDataModule is made over, on first use
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "lightning", None)  # not installed
    with pytest.raises(UsageError) as missing:
        lightning_pytorch()
    assert str(missing.value) == f"CacheDataModule needs lightning: pip install '{DIST_NAME}[lightning]'"
