"""What the feed is for: a small BatchNorm CNN fed by make_loader's defaults learns as well as from a
uniform shuffle, on a cache whose shards each hold one class (which a window of a few shards ruins)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from cachekit import BuildConfig, CachedDataset, build, collate_batch, make_loader
from cachekit.tools.synthetic import synthetic_image

CLASSES, PER_CLASS, SHARD = 10, 48, 24


@pytest.fixture(scope="module")
def class_pure_cache(tmp_path_factory):
    """Ten classes (a tint and a stripe direction each); every shard holds a single class."""
    raw = tmp_path_factory.mktemp("pure") / "raw"
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:40, 0:40]
    for c in range(CLASSES):
        (raw / f"c{c}").mkdir(parents=True)
        tint = np.array([(c * 37) % 255, (c * 91) % 255, (c * 53) % 255], np.float32)
        stripes = 20 * np.sin((xx * np.cos(c) + yy * np.sin(c)) / 2.0)[..., None]
        for i in range(PER_CLASS):
            img = 0.5 * synthetic_image(rng, 40, 40).astype(np.float32) + 0.5 * tint + stripes
            cv2.imwrite(str(raw / f"c{c}" / f"{i}.png"), np.clip(img, 0, 255).astype(np.uint8)[..., ::-1])
    out = raw.parent / "cache"
    build(raw, out, BuildConfig(size=24, shard_size=SHARD, order="sorted", workers=1, progress=False))
    ds = CachedDataset(out)
    labels = ds.read_batch(range(len(ds)))[1]
    first = ds.shard_offsets[:-1]
    assert all(len(set(labels[a : a + SHARD].tolist())) == 1 for a in first)  # the hard case
    return out


def _accuracy(ds, loader, seed: int, epochs: int = 3) -> float:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, CLASSES),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):  # no set_epoch: make_loader reshuffles each pass by itself
        for x, y in loader:
            loss = F.cross_entropy(model(x.float() / 255), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    x, y = ds.read_batch(range(len(ds)))
    with torch.no_grad():
        return (model(x.float() / 255).argmax(1) == y).float().mean().item()


@pytest.mark.slow
def test_make_loader_defaults_learn_like_a_uniform_shuffle(class_pure_cache):
    torch.set_num_threads(1)
    ds = CachedDataset(class_pure_cache)
    seeds = range(3)
    ours = np.mean([_accuracy(ds, make_loader(ds, 32, seed=s), s) for s in seeds])
    uniform = np.mean(
        [
            _accuracy(
                ds,
                DataLoader(
                    ds, 32, shuffle=True, collate_fn=collate_batch, generator=torch.Generator().manual_seed(s)
                ),
                s,
            )
            for s in seeds
        ]
    )
    window = np.mean([_accuracy(ds, make_loader(ds, 32, seed=s, window=4 * SHARD), s) for s in seeds])
    assert ours >= uniform - 0.08, (ours, uniform)
    assert window < uniform - 0.15, (window, uniform)  # what the old 4-shard window gave: the test can tell
