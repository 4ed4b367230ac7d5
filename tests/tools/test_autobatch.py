"""autobatch on the CPU against a memory budget, with a model whose memory is known exactly."""

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
    # weight + its gradient (4 + 4), the input batch, the input saved by the multiply, the Hog's bytes
    return 8 + batch * (768 + 768 + PER_SAMPLE)


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
