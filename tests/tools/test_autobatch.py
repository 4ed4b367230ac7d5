"""autobatch against a memory budget on the CPU, with models whose memory is known exactly, and
against a fake CUDA memory report."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cachekit import UsageError, autobatch

PER_SAMPLE = 100_000  # bytes the Hog keeps for backward per sample
SHAPE = (3, 8, 8)  # 768 bytes per float32 sample


class _Hog(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(torch.empty(len(x), PER_SAMPLE, dtype=torch.uint8))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


class Growing(nn.Module):
    """Keeps ``PER_SAMPLE`` bytes per sample for backward; raises CUDA's OOM above ``oom_above``."""

    def __init__(self, oom_above: int | None = None) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.oom_above = oom_above
        self.calls: list[int] = []

    def forward(self, x):
        self.calls.append(len(x))
        if self.oom_above is not None and len(x) > self.oom_above:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return _Hog.apply(x * self.w)


def expected_peak(batch: int) -> int:
    # weight + its gradient + AdamW's exp_avg, exp_avg_sq and step (5 x 4 bytes), the input batch
    # (the multiply saves it too: the same storage, counted once) and the Hog's bytes
    return 20 + batch * (768 + PER_SAMPLE)


@pytest.mark.parametrize("budget", [1_000_000, 3_333_333, 25_000_000])
def test_largest_batch_under_the_budget(budget):
    model = Growing()
    got = autobatch(model, SHAPE, device="cpu", memory_budget=budget, fraction=1.0)
    assert expected_peak(got) <= budget < expected_peak(got + 1)
    assert len(model.calls) < 15  # profiled and fitted, not tried one by one


def test_fraction_of_the_budget_and_max_batch():
    budget = 10_000_000
    got = autobatch(Growing(), SHAPE, device="cpu", memory_budget=budget, fraction=0.5)
    assert expected_peak(got) <= budget * 0.5 < expected_peak(got + 1)
    assert autobatch(Growing(), SHAPE, device="cpu", memory_budget=10**12, max_batch=300) == 300


def test_out_of_memory_errors_back_off_by_binary_search():
    model = Growing(oom_above=37)
    got = autobatch(model, SHAPE, device="cpu", memory_budget=10**10, fraction=1.0, max_batch=4096)
    assert got == 37
    assert max(model.calls) > 37  # it did hit the error and recovered


def test_amp_measures_under_autocast():
    seen = []

    class Probe(Growing):
        def forward(self, x):
            seen.append(torch.is_autocast_enabled("cpu"))
            return super().forward(x)

    got = autobatch(Probe(), SHAPE, device="cpu", memory_budget=5_000_000, amp=True)
    assert got >= 1 and all(seen)


def test_clear_errors():
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="needs a CUDA GPU"):
            autobatch(Growing(), SHAPE, device="cuda")
    with pytest.raises(UsageError, match="memory_budget"):
        autobatch(Growing(), SHAPE, device="cpu")
    with pytest.raises(UsageError, match="a batch of 1 does not fit"):
        autobatch(Growing(), SHAPE, device="cpu", memory_budget=1000)
    with pytest.raises(ValueError, match="boom"):  # errors that are not OOM are not swallowed

        class Broken(nn.Module):
            def forward(self, x):
                raise ValueError("boom")

        autobatch(Broken(), SHAPE, device="cpu", memory_budget=10**9)


class Tied(nn.Module):
    """One weight used by two layers: the second matmul saves it again, and saves its input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return self.lin(self.lin(x))


def test_each_storage_is_counted_once_and_optimizer_state_counts():
    weight = 64 * 64 * 4

    def peak(batch: int, state: int) -> int:
        # weight, its gradient and the optimizer's state; the input and the hidden layer, 256 bytes a sample each
        return 2 * weight + state + batch * 512

    budget = 2_000_000
    adamw = autobatch(Tied(), (64,), device="cpu", memory_budget=budget, fraction=1.0)
    assert peak(adamw, 2 * weight + 4) <= budget < peak(adamw + 1, 2 * weight + 4)
    sgd = autobatch(
        Tied(),
        (64,),
        device="cpu",
        memory_budget=budget,
        fraction=1.0,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
    )
    assert peak(sgd, 0) <= budget < peak(sgd + 1, 0) and sgd > adamw


def test_weights_and_buffers_are_restored():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    autobatch(
        model, SHAPE, device="cpu", memory_budget=10**6, optimizer=lambda p: torch.optim.SGD(p, lr=10.0)
    )
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and not model.training


GB = 10**9


class FakeGpu:
    """An 80 GB GPU where another process holds 40 GB and this one has 10 GB reserved (its model)."""

    total, others, base, per_sample = 80 * GB, 40 * GB, 10 * GB, GB // 10

    def __init__(self, monkeypatch) -> None:
        self.reserved = self.peak = self.base
        for name in (
            "mem_get_info",
            "memory_reserved",
            "reset_peak_memory_stats",
            "max_memory_reserved",
            "empty_cache",
        ):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def mem_get_info(self, device=None):
        return self.total - self.others - self.reserved, self.total

    def memory_reserved(self, device=None):
        return self.reserved

    def reset_peak_memory_stats(self, device=None):
        self.peak = self.reserved

    def max_memory_reserved(self, device=None):
        return self.peak

    def empty_cache(self):
        self.reserved = self.base

    def allocate(self, batch: int) -> None:
        wanted = self.base + batch * self.per_sample
        if wanted > self.total - self.others:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 100.00 MiB")
        self.reserved = self.peak = max(self.peak, wanted)


def test_cuda_plans_against_a_share_of_free_memory(monkeypatch):
    from cachekit.tools.autobatch import _CudaMeter, _plan

    gpu = FakeGpu(monkeypatch)
    meter = _CudaMeter(torch.device("cuda"), 0.8, None)
    assert meter.budget == 10 * GB + int(0.8 * 30 * GB)  # not 0.8 x 80 GB: 40 GB belong to someone else

    class OnFakeGpu(Growing):
        def forward(self, x):
            gpu.allocate(len(x))
            return super().forward(x)

    model = OnFakeGpu()
    # the same search as on a real GPU, with the tensors on the CPU and the memory report faked
    got = _plan(model, SHAPE, torch.device("cpu"), meter, 4096, False, None, torch.float32, None)
    assert got == 240  # 10 GB + 240 x 0.1 GB = 34 GB = what it holds + 80% of the 30 GB free
    assert max(model.calls) < 300  # never ran into the out-of-memory wall at 300
    budget = _CudaMeter(torch.device("cuda"), 0.5, memory_budget=40 * GB).budget
    assert budget == 20 * GB  # an explicit budget replaces the free memory
