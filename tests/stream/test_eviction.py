"""The plan board: planners publish the order, evictors let go of the shard needed furthest ahead."""

from __future__ import annotations

import itertools
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, make_loader, read_manifest
from cachekit.stream.eviction import PlanBoard, fewest_downloads

NAMES = [f"shard-{k}.pt" for k in range(6)]


def _entries(folder: Path, shards) -> list:
    return [(float(t), 10, folder / NAMES[k], folder / f".{NAMES[k]}.lock") for t, k in enumerate(shards)]


def test_the_shard_needed_furthest_ahead_goes_first(tmp_path):
    board = PlanBoard(tmp_path, NAMES)
    board.publish(np.array([0, 0, 1, 1, 2, 2]), following=np.array([3, 3, 1, 1, 0, 0]))
    board.advance(2)  # shard 0 read; shard 1 now
    distances = PlanBoard(tmp_path, NAMES).distances()  # as another process reads the board
    assert distances[1] == 0 and distances[2] == 2  # in use; next
    assert distances[3] == 6 - 2 and distances[0] == 6 + 4 - 2  # next epoch: 3 first, 0 last
    assert distances[4] == distances[5] == np.iinfo(np.int64).max  # nobody plans them
    order = PlanBoard(tmp_path, NAMES).order(_entries(tmp_path, [1, 0, 4, 2, 3, 5]))
    assert [e[2].name for e in order] == [NAMES[k] for k in (4, 5, 0, 3, 2, 1)]  # unplanned first (LRU)
    board.close()


def test_another_cache_and_the_nearest_planner_count(tmp_path):
    ahead, behind = PlanBoard(tmp_path, NAMES), PlanBoard(tmp_path, NAMES)
    ahead.publish(np.array([0, 1, 2, 3]))
    ahead.advance(3)  # this rank is at shard 3: 0-2 done for it
    behind.publish(np.array([0, 1, 2, 3]))
    behind.advance(1)  # another rank of the node still needs 2 soon
    board = PlanBoard(tmp_path, NAMES)
    assert board.distances()[2] == 1 and board.distances()[0] == np.iinfo(np.int64).max
    elsewhere = [(0.0, 10, tmp_path.parent / "other" / NAMES[2], None)]
    assert board.order(elsewhere + _entries(tmp_path, [2]))[0] is elsewhere[0]  # not ours: no plan


def _plan_and_die(folder: str) -> None:
    PlanBoard(folder, NAMES).publish(np.array([5, 5]))


def test_a_dead_planner_is_forgotten(tmp_path):
    proc = mp.get_context("spawn").Process(target=_plan_and_die, args=(str(tmp_path),))
    proc.start()
    proc.join()
    assert list(tmp_path.glob(".plan-*"))  # it left its file
    assert PlanBoard(tmp_path, NAMES).distances()[5] == np.iinfo(np.int64).max
    assert not list(tmp_path.glob(".plan-*"))  # and the next reader removed it


def test_fetching_ahead_never_pushes_out_what_is_needed_sooner(tmp_path):
    board = PlanBoard(tmp_path, NAMES)
    board.publish(np.array([0, 1, 2, 3, 4]))
    held = _entries(tmp_path, [0, 1])  # 20 bytes held of 30
    assert board.worth_fetching(NAMES[2], 10, held, 30)  # room left
    assert not board.worth_fetching(NAMES[4], 20, held, 30)  # 0 and 1 are needed before 4
    assert board.worth_fetching(NAMES[4], 10, held + _entries(tmp_path, [5]), 30)  # 5: nobody's


def _optimal(seq, capacity: int) -> int:
    """Fewest misses by brute force over every choice of victim."""
    best = [len(seq)]

    def go(i: int, held: frozenset, misses: int) -> None:
        if misses >= best[0]:
            return
        if i == len(seq):
            best[0] = misses
            return
        if seq[i] in held:
            return go(i + 1, held, misses)
        if len(held) < capacity:
            return go(i + 1, held | {seq[i]}, misses + 1)
        for victim in held:
            go(i + 1, (held - {victim}) | {seq[i]}, misses + 1)

    go(0, frozenset(), 0)
    return best[0]


def test_fewest_downloads_is_optimal_for_shards_of_one_size():
    rng = np.random.default_rng(0)
    for _ in range(20):
        seq = rng.integers(0, 5, 10).tolist()
        for capacity in (1, 2, 3):
            assert fewest_downloads(seq, capacity=capacity) == _optimal(seq, capacity)
    epochs = list(itertools.chain(*(rng.permutation(6).tolist() for _ in range(3))))
    assert fewest_downloads(epochs, capacity=6) == 6 and fewest_downloads(epochs, capacity=1) == 18


@pytest.mark.slow
def test_a_limit_of_a_third_of_the_cache_downloads_close_to_the_fewest(s3_endpoint, tmp_path):
    import s3fs

    from cachekit.tools.synthetic import make_synthetic_folder

    raw = make_synthetic_folder(tmp_path / "raw", 480, classes=6, size=(24, 24), seed=3)
    build(raw, tmp_path / "c", BuildConfig(size=24, shard_size=16, workers=1, progress=False))  # 30 shards
    s3fs.S3FileSystem(anon=False).put(str(tmp_path / "c") + "/", "datasets/third", recursive=True)
    shards = read_manifest(tmp_path / "c").shards
    limit = sum(s.bytes for s in shards) // 3
    ds = CachedDataset("s3://datasets/third", local_cache=tmp_path / "lc", local_cache_bytes=limit)
    loader = make_loader(ds, 8, seed=4, workers=2)
    used = []  # the shards in the order the epochs use them
    for _ in range(3):
        assert sum(len(labels) for _, labels in loader) == 480
        order = np.searchsorted(ds.shard_offsets, loader.sampler.last_indices, side="right") - 1
        used += order[np.concatenate([[True], order[1:] != order[:-1]])].tolist()
    fewest = fewest_downloads(used, {k: s.bytes for k, s in enumerate(shards)}, limit)
    downloads = len(ds._remote.cache.downloads())
    # least recently used first made 1.2x the fewest here (the next epoch's first shards were gone)
    assert downloads <= 1.1 * fewest, (downloads, fewest)
