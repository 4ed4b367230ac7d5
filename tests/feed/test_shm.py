"""Worker processes and a small /dev/shm: refused in one line when asked for, in-process reads otherwise."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from cachekit import CachedDataset, make_loader
from cachekit.feed import shm
from cachekit.feed.shm import ShmTooSmall, shm_needed_bytes, shm_shortfall


def test_the_need_counts_every_batch_in_flight():
    assert shm_needed_bytes(10, 2, 2) == 60
    assert shm_shortfall(10**9, 0, 2) is None  # no workers, nothing handed over


def test_a_short_shm_names_the_docker_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=None: 64 * 2**20)
    why = shm_shortfall(50 * 2**20, 2, 2)
    assert why is not None and "--shm-size" in why and "--ipc=host" in why and "\n" not in why
    assert shm_shortfall(2**20, 2, 2) is None


def _script(cache: str) -> str:
    return textwrap.dedent(
        f"""
        import warnings
        from cachekit import CachedDataset, make_loader
        from cachekit.transforms import RandomResizedCrop
        big = [RandomResizedCrop(1024)]  # 16 x 3 x 1024 x 1024: 50 MB a batch
        try:
            make_loader(CachedDataset({cache!r}), 16, workers=2, augment=big)
        except ValueError as exc:
            print("ASKED:", type(exc).__name__, str(exc).count("\\n"), str(exc))
        ds = CachedDataset({cache!r}, transform=lambda x: x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make_loader(ds, 16, augment=big, augment_on="threads")
        images, labels = next(iter(loader))
        print("AUTO:", loader.num_workers, tuple(images.shape), len(caught), str(caught[0].message))
        """
    )


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_64_mb_shm_refuses_asked_workers_and_reads_in_process_otherwise(small_cache):
    """The container case itself: a 64 MB tmpfs on /dev/shm in a private mount namespace."""
    mount = "mount -t tmpfs -o size=64m tmpfs /dev/shm"
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", mount], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.decode().strip()}")
    code = _script(str(small_cache))
    proc = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{mount} && exec "$0" -c "$1"',
            sys.executable,
            code,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    asked = next(line for line in proc.stdout.splitlines() if line.startswith("ASKED:"))
    assert asked.startswith("ASKED: ShmTooSmall 0 /dev/shm has 64 MiB free") and "--shm-size" in asked
    auto = next(line for line in proc.stdout.splitlines() if line.startswith("AUTO:"))
    assert auto.startswith("AUTO: 0 (16, 3, 1024, 1024) 1") and "--ipc=host" in auto


def test_asked_workers_are_refused_before_any_starts(small_cache, monkeypatch):
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=None: 1000)
    with pytest.raises(ShmTooSmall, match="worker processes"):
        make_loader(CachedDataset(small_cache), 8, workers=2)
    assert make_loader(CachedDataset(small_cache), 8, workers=0).num_workers == 0


def test_make_loader_opens_a_path_and_refuses_what_is_not_a_map_style_dataset(small_cache):
    loader = make_loader(str(small_cache), 4, shuffle=False)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and labels.dtype.is_floating_point is False
    assert make_loader(small_cache, 4).dataset.num_shards == CachedDataset(small_cache).num_shards
    for bad in (42, iter(range(3)), object()):
        with pytest.raises(TypeError, match="map-style dataset"):
            make_loader(bad, 4)
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            yield from range(3)

        def __getitem__(self, i):
            return i

        def __len__(self):
            return 3

    with pytest.raises(TypeError, match="not Stream"):
        make_loader(Stream(), 4)
