"""prepare_loader under Accelerate's own Accelerator, two CPU processes started by torchrun: each reads its
own share, each epoch anew, with mixed precision on; a saved state resumes at the next batch."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import HERE, SPLITS, run_job

from cachekit.constants import DIST_NAME
from cachekit.errors import UsageError

accelerate = pytest.importorskip("accelerate")

JOB = str(HERE / "accelerate_job.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]  # fmt: skip
#: 40 samples, 2 processes, batches of 4: 5 batches an epoch; the state is saved after batch 1 of epoch 1.
EPOCHS, SAVE_AT = 2, (1, 1)


def _rows(out: Path) -> dict[int, list[dict]]:
    return {
        r: [json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)
    }


@pytest.mark.slow
def test_two_processes_read_their_shares_anew_each_epoch_and_a_saved_state_resumes_exactly(
    numbered, tmp_path
):
    cache = str(numbered / "train")
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir(), resumed.mkdir()
    common = ["--epochs", str(EPOCHS), "--mixed-precision", "bf16"]
    run_job([JOB, cache, str(full), *common, "--save-at", f"{SAVE_AT[0]}:{SAVE_AT[1]}"], full, TORCHRUN)
    rows = _rows(full)
    seen: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rank, lines in rows.items():
        for row in lines:
            seen[row["epoch"]][rank] += row["labels"]
    assert sorted(seen) == list(range(EPOCHS))
    for ranks in seen.values():  # every sample exactly once an epoch, half in each process
        assert len(ranks[0]) == len(ranks[1]) == SPLITS["train"] // 2
        assert sorted(ranks[0] + ranks[1]) == list(range(SPLITS["train"]))
    assert seen[0][0] != seen[1][0]  # a new order every epoch
    for lines in rows.values():  # bf16 inside the model, the batches as the loader gave them
        assert {(r["dtype"], r["inside"]) for r in lines} == {("torch.uint8", "torch.bfloat16")}

    run_job([JOB, cache, str(resumed), *common, "--resume", str(full / "state")], resumed, TORCHRUN)
    again = _rows(resumed)
    for rank in (0, 1):  # the resumed run reads exactly what the whole one read after the save
        after = [r for r in rows[rank] if (r["epoch"], r["step"]) > SAVE_AT]
        assert [(r["epoch"], r["step"]) for r in again[rank]][:1] == [(1, 2)] and again[rank] == after


def test_bad_input_is_one_line(numbered, monkeypatch):
    from cachekit.trainers.accelerate import accelerate_module, prepare_loader
    from cachekit.trainers.versions import check_version

    with pytest.raises(UsageError, match="prepare_loader takes an accelerate.Accelerator, got str"):
        prepare_loader("not an accelerator", numbered / "train", 4)
    with pytest.raises(UsageError) as old:
        check_version("accelerate", "0.34.2", f"pip install '{DIST_NAME}[accelerate]'")
    assert str(old.value) == (
        f"cachekit's accelerate adapter needs accelerate from 1.0 to before 2.0, found 0.34.2: "
        f"pip install '{DIST_NAME}[accelerate]'"
    )
    check_version("accelerate", accelerate.__version__, "")
    monkeypatch.setattr(
        accelerate, "__version__", "2.0.0"
    )  # the installed Accelerate, as a version not supported
    with pytest.raises(
        UsageError, match=r"^cachekit's accelerate adapter needs accelerate from 1.0 to before 2.0"
    ):
        prepare_loader(None, numbered / "train", 4)
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "accelerate", None)  # not installed
    with pytest.raises(UsageError) as missing:
        accelerate_module()
    assert str(missing.value) == f"prepare_loader needs accelerate: pip install '{DIST_NAME}[accelerate]'"


MISMATCHED = """
from accelerate import Accelerator
from cachekit.errors import UsageError
from cachekit.trainers.accelerate import prepare_loader
try:
    prepare_loader(Accelerator(), {cache!r}, 4)  # on CPUs without cpu=True: each process trains alone
except UsageError as exc:
    print("refused:", exc)
"""


@pytest.mark.slow
def test_an_accelerator_that_is_not_the_process_group_is_refused(numbered, tmp_path):
    script = tmp_path / "mismatched.py"
    script.write_text(MISMATCHED.format(cache=str(numbered / "train")))
    out = run_job([str(script)], tmp_path, TORCHRUN).stdout.splitlines()
    assert (
        out
        == [
            "refused: a process group of 2 processes is up but the Accelerator trains in 1, so each would read a "
            "share and none would synchronise its gradients: on CPUs, Accelerator(cpu=True) (accelerate launch --cpu)"
        ]
        * 2
    )
