"""Readers keep the version they opened: an epoch finishes on it while --update and --overwrite write the next."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, read_manifest

_READER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from cachekit import CachedDataset
    cache, result, go = sys.argv[1:4]
    ds = CachedDataset(cache)  # opens the manifest of version N; shards open lazily, one by one
    images, labels, sources = [], [], []
    try:
        for k in range(ds.num_shards):
            rows = np.arange(ds.shard_offsets[k], ds.shard_offsets[k + 1])
            batch = ds.read_batch(rows)
            images.append(batch[0].numpy().copy())
            labels.append(batch[1].numpy().copy())
            sources += [ds.source(int(i)) for i in rows]
            if k == 0:
                open(result + ".started", "w").close()
                while not os.path.exists(go):
                    time.sleep(0.01)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    np.savez(result, images=np.concatenate(images), labels=np.concatenate(labels), sources=np.array(sources))
    """
)


def _everything(cache):
    ds = CachedDataset(cache)
    images, labels = ds.read_batch(np.arange(len(ds)))
    return images.numpy(), labels.numpy(), np.array([ds.source(i) for i in range(len(ds))])


@pytest.mark.slow
@pytest.mark.parametrize("grace", [None, 0], ids=["default-grace", "grace-0"])
def test_a_reader_finishes_its_epoch_on_the_version_it_opened(small_tree, tmp_path, grace):
    raw, out = tmp_path / "raw", tmp_path / "cache"
    shutil.copytree(small_tree, raw)
    config = dict(size=16, shard_size=5, workers=2, progress=False, grace=grace)
    build(raw, out, BuildConfig(**config))
    reference = _everything(out)
    result, go = tmp_path / "read.npz", tmp_path / "go"
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(out), str(result), str(go)], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "read.npz.started").exists():
        assert reader.poll() is None and time.monotonic() < deadline, reader.stdout.read()
        time.sleep(0.01)

    # version N+1: inputs changed, --update; version N+2: other options, --overwrite
    (raw / "class_000" / "img_0000000.jpg").unlink()
    shutil.copy(raw / "class_001" / "img_0000001.jpg", raw / "class_002" / "copy.jpg")
    assert build(raw, out, BuildConfig(update=True, **config)).status == "updated"
    assert build(raw, out, BuildConfig(**{**config, "size": 24}, overwrite=True)).status == "built"
    assert CachedDataset(out).sample_shape == (3, 24, 24)  # new readers see the newest version
    go.write_text("")
    output, _ = reader.communicate(timeout=60)

    if grace == 0:  # the override: old shards removed at once, so the old reader loses them
        assert reader.returncode == 3 and "missing" in output
        return
    assert reader.returncode == 0, output
    got = np.load(result)
    assert np.array_equal(got["images"], reference[0]) and np.array_equal(got["labels"], reference[1])
    assert list(got["sources"]) == list(reference[2])
    # the retired shards go at a later build, once their grace period is over
    later = build(raw, out, BuildConfig(**{**config, "size": 24, "grace": 0}))
    assert later.status == "up to date" and later.removed > 0
    assert sorted(p.name for p in out.glob("shard-*")) == sorted(s.file for s in read_manifest(out).shards)
