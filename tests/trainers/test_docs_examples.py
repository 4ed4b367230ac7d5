"""The Lightning and Accelerate examples of docs/TRAINING.md run as written, in two processes on the CPU,
on a small split cache (paths, sizes, epochs and the device substituted)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import run_job

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]  # fmt: skip


def training_block(marker: str) -> str:
    """The python block of docs/TRAINING.md holding ``marker``."""
    text = (ROOT / "docs" / "TRAINING.md").read_text(encoding="utf-8")
    (code,) = [
        m.group(1) for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M) if marker in m.group(1)
    ]
    return code


def substituted(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in code, f"the docs changed: {old!r} is no longer in their example"
        code = code.replace(old, new)
    return code


@pytest.mark.slow
def test_the_lightning_example_trains_under_ddp_and_checkpoints(numbered, tmp_path):
    pytest.importorskip("lightning")
    code = substituted(
        training_block("class Classifier(L.LightningModule):"),
        {'"cache/",': f"{str(numbered)!r},", "batch_size=256": "batch_size=4", "RandomResizedCrop(224)":
         "RandomResizedCrop(24)", "CenterCrop(224)": "CenterCrop(24)", 'accelerator="gpu", devices=4':
         'accelerator="cpu", devices=2', "max_epochs=90": "max_epochs=2", "every_n_train_steps=1000":
         "every_n_train_steps=3", "classes=1000": "classes=40"},
    )  # fmt: skip
    script = tmp_path / "train_lightning.py"
    script.write_text(code)
    proc = run_job([str(script)], tmp_path)
    assert "`Trainer.fit` stopped: `max_epochs=2` reached." in proc.stdout + proc.stderr
    saved = sorted(p.name for p in tmp_path.rglob("*.ckpt"))  # 2 epochs of 5 steps (40 samples, 2 ranks of 4)
    assert saved == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt", "epoch=1-step=9.ckpt"]


@pytest.mark.slow
def test_the_accelerate_example_runs_in_two_processes(numbered, tmp_path):
    pytest.importorskip("accelerate")
    code = substituted(
        training_block("model, optimizer = accelerator.prepare(model, optimizer)  # not the loader"),
        {"Accelerator(mixed_precision=": "Accelerator(cpu=True, mixed_precision=",
         '"cache/train", 256': f"{str(numbered / 'train')!r}, 4", "RandomResizedCrop(224)": "RandomResizedCrop(24)",
         "range(90)": "range(2)", "step % 1000 == 999": "step % 3 == 2", "nn.Linear(32, 1000)": "nn.Linear(32, 40)"},
    )  # fmt: skip
    script = tmp_path / "train_accelerate.py"
    script.write_text(code)
    proc = run_job([str(script)], tmp_path, TORCHRUN)
    assert "2 processes, 5 batches each an epoch" in proc.stdout, proc.stdout
    assert (tmp_path / "checkpoints" / "latest" / "custom_checkpoint_0.pkl").is_file()
