"""The loader's last stage on the CPU: normalisation in place where the batch is its own, the same bits
as the formula, a batch handed in as floats left as it is, in either memory format."""

from __future__ import annotations

import torch

from cachekit.feed.devicestage import DeviceStage

MEAN, STD = (0.4, 0.45, 0.5), (0.2, 0.22, 0.25)


def _formula(x: torch.Tensor) -> torch.Tensor:
    mean, std = torch.tensor(MEAN).view(1, -1, 1, 1), torch.tensor(STD).view(1, -1, 1, 1)
    return (x.to(torch.float32) / 255.0 - mean) / std if x.dtype == torch.uint8 else (x.float() - mean) / std


def test_normalisation_gives_the_formulas_bits_and_leaves_a_float_batch_as_it_was_given():
    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (4, 3, 9, 11), generator=g, dtype=torch.uint8)
    kept = images.clone()
    for last in (False, True):
        got = DeviceStage(None, mean=MEAN, std=STD, channels_last=last).process((images, torch.zeros(4)))[0]
        assert got.dtype == torch.float32 and torch.equal(got, _formula(images))
        assert got.is_contiguous(memory_format=torch.channels_last) == last
    assert torch.equal(images, kept)
    for dtype in (torch.float32, torch.float16):  # floats from elsewhere: normalised, never written over
        floats = torch.rand((4, 3, 9, 11), generator=g).to(dtype)
        before = floats.clone()
        got = DeviceStage(None, mean=MEAN, std=STD).process((floats, torch.zeros(4)))[0]
        assert torch.equal(floats, before) and torch.equal(got, _formula(floats))
