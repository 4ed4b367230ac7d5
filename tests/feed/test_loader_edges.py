"""make_loader at its edges: wrong arguments, two passes at once, padding, variable-sized caches."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.feed.devicestage import DeviceStage
from cachekit.transforms import (
    ColorJitter,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomRotation,
    RandomZoomOut,
    Resize,
)


@pytest.fixture(scope="module")
def ragged_cache(mixed_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("ragged") / "c"
    build(mixed_tree, out, BuildConfig(pipeline="train-256", size=48, workers=1, progress=False))
    return out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": "8"}, "batch_size must be an integer"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"batch_size": 4, "seed": 1.5}, "seed must be an integer"),
        ({"batch_size": 4, "seed": 2**64}, "seed must be from"),  # it drew what seed=0 draws
        ({"batch_size": 4, "seed": -(2**63) - 1}, "seed must be from"),
        ({"batch_size": 4, "threads": -2}, "threads must be at least 1"),
        ({"batch_size": 4, "workers": 1, "prefetch_factor": 0}, "prefetch_factor must be at least 1"),
        ({"batch_size": 4, "dtype": "float16"}, "torch floating point type"),
        ({"batch_size": 4, "device": "nonsense"}, "is not a device"),
    ],
)
def test_wrong_arguments_are_one_line_before_anything_starts(small_cache, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_loader(CachedDataset(small_cache), **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_says_so(small_cache):
    with pytest.raises(ValueError, match="CUDA is not available"):
        make_loader(CachedDataset(small_cache), 4, device="cuda")


def test_normalising_by_a_zero_standard_deviation_is_refused():
    with pytest.raises(ValueError, match="standard deviation 0"):
        DeviceStage("cpu", mean=(0.5, 0.5, 0.5), std=(0.2, 0.0, 0.2))


def test_a_second_pass_begun_mid_pass_ends_the_first_with_an_error(small_cache):
    loader = make_loader(CachedDataset(small_cache), 4)
    first = iter(loader)
    next(first)
    second = iter(loader)
    assert next(second)[0].shape[0] == 4
    outcome = {}

    def read_first():
        try:
            next(first)
            outcome["got"] = "a batch"
        except RuntimeError as exc:
            outcome["got"] = str(exc)

    reader = threading.Thread(target=read_first, daemon=True)
    reader.start()
    reader.join(60)
    assert "another began" in outcome.get("got", "it hung")
    assert sum(len(y) for _, y in second) + 4 == 40  # the new pass goes on, whole


def test_pad_gives_sizes_on_every_cache(small_cache, ragged_cache):
    images, labels, sizes = next(iter(make_loader(CachedDataset(small_cache), 4, pad=True)))
    assert sizes.tolist() == [list(images.shape[-2:])] * 4
    ds = CachedDataset(ragged_cache, transform=lambda t: t.flip(-1))  # a per-sample function keeps sizes
    for workers in (0, 2):
        images, labels, sizes = next(iter(make_loader(ds, 3, pad=True, workers=workers, shuffle=False)))
        for k in range(3):
            h, w = sizes[k].tolist()
            assert torch.equal(images[k, :, :h, :w], ds[k][0]) and not images[k, :, h:].any()


def test_an_augment_of_variable_sizes_is_refused_when_the_loader_is_made(ragged_cache):
    ds = CachedDataset(ragged_cache)
    for augment in ([RandomHorizontalFlip()], [ColorJitter(0.4)]):
        for pad in (False, True):
            with pytest.raises(ValueError, match="must then end in a fixed size"):
                make_loader(ds, 3, augment=augment, pad=pad)
    images, _ = next(iter(make_loader(ds, 3, augment=[RandomHorizontalFlip(), RandomResizedCrop(24)])))
    assert images.shape[1:] == (3, 24, 24)


def test_the_batch_size_keeps_augmented_variants_apart(small_tree, tmp_path):
    build(small_tree, tmp_path / "aug", BuildConfig(size=16, augment=3, workers=1, progress=False))
    ds = CachedDataset(tmp_path / "aug")
    loader = make_loader(ds, 32, shuffle=True)
    assert loader.sampler.group_spread == 32
    keys = [np.asarray(ds.extras(i)["input_key"]).tobytes() for i in range(len(ds))]
    for _, _ in loader:
        pass
    order = np.asarray(loader.sampler.last_indices)
    for k in range(0, len(order) - 32 + 1, 32):
        batch_keys = [keys[i] for i in order[k : k + 32]]
        assert len(set(batch_keys)) == 32


def test_a_batch_too_large_to_assemble_is_refused_before_any_read(small_cache):
    ds = CachedDataset(small_cache)
    with pytest.raises(ValueError, match=r"GiB, over the limit of 64 GiB"):
        make_loader(ds, 1024, augment=[RandomResizedCrop(8192)])
    with pytest.raises(ValueError, match="largest side"):
        make_loader(ds, 8, augment=[RandomResizedCrop(10**6)])
    with pytest.raises(ValueError, match="over the limit"):
        make_loader(ds, 10**8)  # 10^8 samples of 3 x 32 x 32


@pytest.mark.parametrize(
    "augment",
    [
        [RandomZoomOut(p=0.5)],
        [RandomRotation(30, expand=True)],
        [RandomResizedCrop(24), RandomZoomOut(side_range=(1.0, 2.0), p=1.0)],
    ],
)
def test_a_list_whose_size_varies_is_refused_when_made_on_a_fixed_size_cache(small_cache, augment):
    """Every stored image is 32 x 32, but these draw a size per sample: refused by make_loader and
    set_augment in one line, not at the first batch (in a worker, under a DataLoader's traceback)."""
    with pytest.raises(ValueError, match="different size for each sample"):
        make_loader(CachedDataset(small_cache), 4, augment=augment)
    loader = make_loader(CachedDataset(small_cache), 4, augment=[RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="different size for each sample"):
        loader.set_augment(augment)
    # the same ended in a fixed size reads; a size drawn once for all (p=1, one ratio) reads as is
    fixed = make_loader(CachedDataset(small_cache), 4, augment=[*augment, Resize((16, 16))], workers=0)
    assert next(iter(fixed))[0].shape[-2:] == (16, 16)
    same = make_loader(CachedDataset(small_cache), 4, augment=[RandomZoomOut(side_range=(2, 2), p=1.0)])
    assert next(iter(same))[0].shape[-2:] == (64, 64)


def _slow(image):
    """A picklable per-sample transform that takes far longer than the loaders below wait."""
    import time

    time.sleep(20)
    return image


def test_worker_processes_fork_as_torchs_do_on_linux_unless_told(small_cache):
    import os
    from pathlib import Path

    def parent(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

    ds = CachedDataset(small_cache)
    forked = make_loader(ds, 8, workers=2)
    assert forked.multiprocessing_context.get_start_method() == "fork" and forked.worker_pids() == []
    assert sum(len(x) for x, _ in forked) == len(ds)
    pids = forked.worker_pids()  # what doctor measures: the workers, children of this process
    assert len(set(pids)) == 2 and {parent(p) for p in pids} == {os.getpid()}
    told = make_loader(ds, 8, workers=1, multiprocessing_context="spawn")
    assert told.multiprocessing_context.get_start_method() == "spawn"
    assert sum(len(x) for x, _ in told) == len(ds)
    local = make_loader(CachedDataset(small_cache, transform=lambda x: x), 8, workers=2)  # no pickling: forked
    assert local.multiprocessing_context.get_start_method() == "fork"
    assert sum(len(x) for x, _ in local) == len(ds)  # and it reads
    assert make_loader(ds, 8).multiprocessing_context is None  # no workers, no processes
    # a dataset of the user's own forks too: shared with the parent's pages, not pickled to each
    plain = make_loader(torch.utils.data.TensorDataset(torch.zeros(16, 3, 4, 4), torch.arange(16)), 8, workers=2)
    assert plain.multiprocessing_context.get_start_method() == "fork" and sum(len(b[0]) for b in plain) == 16


def _fill_from_environment(image):
    """A picklable per-sample transform: the image filled with the worker's ``CACHEKIT_TEST_FILL``."""
    import os

    return torch.full_like(torch.as_tensor(image), int(os.environ.get("CACHEKIT_TEST_FILL", "0")))


@pytest.mark.slow  # a forkserver starts (a few seconds)
def test_forkserver_workers_see_the_environment_of_when_the_loader_was_made(small_cache, monkeypatch):
    monkeypatch.delenv("CACHEKIT_TEST_FILL", raising=False)
    ds = CachedDataset(small_cache, transform=_fill_from_environment)
    first = make_loader(ds, 8, workers=1, shuffle=False, multiprocessing_context="forkserver")
    assert int(next(iter(first))[0].max()) == 0  # starts the forkserver (if none runs yet)
    monkeypatch.setenv("CACHEKIT_TEST_FILL", "7")  # set after the server started: credentials, a proxy
    later = make_loader(ds, 8, workers=2, shuffle=False, multiprocessing_context="forkserver")
    assert {int(x.min()) for x, _ in later} == {7} and {int(x.max()) for x, _ in later} == {7}
    monkeypatch.delenv("CACHEKIT_TEST_FILL")
    again = make_loader(ds, 8, workers=1, shuffle=False, multiprocessing_context="forkserver")
    assert {int(x.max()) for x, _ in again} == {0}  # and unset again


def test_a_stuck_read_ends_in_one_line_instead_of_waiting_for_ever(small_cache):
    from cachekit.feed.prefetch import ReadTimeout

    release = threading.Event()
    ds = CachedDataset(small_cache, transform=lambda x: (release.wait(30), x)[1])
    loader = make_loader(ds, 8, workers=0, timeout=0.5)  # the prefetch thread's read never ends
    assert "prefetch thread" in loader.mode
    with pytest.raises(ReadTimeout, match=r"prefetch thread read no batch in 0.5 s") as info:
        next(iter(loader))
    release.set()
    assert "\n" not in str(info.value) and isinstance(info.value, TimeoutError)

    workers = make_loader(CachedDataset(small_cache, transform=_slow), 8, workers=1, timeout=1)
    with pytest.raises(ReadTimeout, match=r"1 worker processes \(started by fork\) in 1 s"):
        next(iter(workers))
    for bad in (0, -1, float("inf"), "60", True):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            make_loader(ds, 8, timeout=bad)


def test_the_mode_says_how_a_loader_reads_and_augments(small_cache):
    ds = CachedDataset(small_cache)
    assert make_loader(ds, 8, threads=1).mode == "in-process batched reads + prefetch thread"
    assert make_loader(ds, 8, threads=3, prefetch_thread=False).mode == "in-process batched reads, 3 threads over each batch"
    listed = make_loader(ds, 8, threads=1, augment=[RandomResizedCrop(16)])
    assert listed.mode == "in-process batched reads + prefetch thread; augment on CPU threads"
    scheduled = make_loader(ds, 8, threads=1, augment=lambda epoch: [RandomResizedCrop(16)])
    assert scheduled.mode == (
        "in-process batched reads + prefetch thread; augment a function of the epoch; augment on CPU threads"
    )


class _NodeCache:
    """A cache whose node shard cache holds the shards of a batch over blocks of at most ``fits`` samples."""

    def __init__(self, fits: int) -> None:
        self.fits, self.asked = fits, []

    def check_batch_shards(self, batch_size, window, processes, *, world, partitions):
        from cachekit import UsageError

        self.asked.append(window)
        if window > self.fits:
            raise UsageError(f"a window of {window} pins more shards than the node cache holds")


@pytest.mark.parametrize("fits, want", [(64, 64), (20, 16), (5, 4), (1, 1), (0, 64)])
def test_the_window_halves_until_a_batch_s_shards_fit_the_node_cache(fits, want):
    from cachekit.feed.loaderoptions import window_that_fits

    dataset = _NodeCache(fits)
    assert window_that_fits(dataset, 64, 8, 2, 1, 1) == want
    assert dataset.asked[0] == 64 and all(b == a // 2 or b == 1 for a, b in zip(dataset.asked, dataset.asked[1:]))
    assert window_that_fits(object(), 64, 8, 2, 1, 1) == 64  # a local cache: nothing to fit


def test_a_rank_without_batches_is_told_the_two_ways_out_in_one_line(small_cache):
    ds = CachedDataset(small_cache)
    with pytest.raises(ValueError) as info:
        make_loader(ds, batch_size=len(ds) + 1, drop_last=True)
    assert str(info.value) == (
        f"rank 0 of 1 would get no batches ({len(ds)} of {len(ds)} samples, batch_size {len(ds) + 1}, "
        "drop_last=True): every rank would skip the epoch; use a smaller batch_size or drop_last=False"
    )


@pytest.mark.parametrize(
    "caught, said",
    [
        ("Caught UsageError in DataLoader worker process 0.\nUsageError: op failed on sample 3", "op failed on sample 3"),
        (
            "Caught UsageError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
            '  File "x.py", line 1\nUsageError: augment: UsageError: raised by the op',
            "augment: UsageError: raised by the op",
        ),
    ],
)
def test_a_usage_error_from_a_worker_is_its_own_last_line(caught, said):
    """DataLoader re-raises a worker's exception as its traceback in text; a usage error is said as the
    line the user's op raised (split once: the message may itself name the error's type)."""
    from cachekit import UsageError
    from cachekit.feed.cacheloader import _said_in_one_line

    def batches():
        yield 1
        raise UsageError(caught)

    it = _said_in_one_line(batches())
    assert next(it) == 1
    with pytest.raises(UsageError) as info:
        next(it)
    assert str(info.value) == said


def test_a_loader_logs_what_it_chose_and_reads_a_plain_torch_dataset_in_process(small_cache, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="cachekit"):
        make_loader(CachedDataset(small_cache), 8, threads=1, pin_memory=False)
    assert "make_loader: in-process batched reads + prefetch thread, batch 8, pin_memory=False, one process" in caplog.text
    plain = make_loader(torch.utils.data.TensorDataset(torch.zeros(16, 3, 4, 4), torch.arange(16)), 8, seed=0)
    assert plain.num_workers == 0 and sorted(torch.cat([y for _, y in plain]).tolist()) == list(range(16))


NOTEBOOK_TRANSFORM = """
import warnings
from cachekit import CachedDataset, make_loader

def keep(image):
    return image

with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    loader = make_loader(CachedDataset({root!r}, transform=keep), 4, workers=1, timeout=30, pad=True)
print(loader.multiprocessing_context.get_start_method(), sum(1 for _ in loader), len(said))
"""


def test_a_notebooks_transform_reaches_the_forked_workers(small_cache):
    """A dataset whose ``transform=`` is a notebook's function (here ``python -c``'s) is read by the
    workers, which fork and so have it, with no warning."""
    import subprocess

    code = NOTEBOOK_TRANSFORM.format(root=str(small_cache))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    method, batches, warned = done.stdout.split()
    assert method == "fork" and int(batches) > 0 and warned == "0"
