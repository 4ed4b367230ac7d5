"""The node shard cache on a shared machine: a private folder, no link followed, copies checked before reuse.

A cache reached by a ``file://`` URL goes through the node cache exactly as one on object storage
does (download, verify, rename, pin), without a server.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from cachekit import CachedDataset, CacheError, UsageError, read_manifest
from cachekit.stream import shardcache
from cachekit.stream.copies import record_path


@pytest.fixture
def url(small_cache) -> str:
    return f"file://{small_cache}"


def _folder(root, small_cache):
    return root / read_manifest(small_cache).fingerprint[:24]


def _reference(small_cache):
    return CachedDataset(small_cache).read_batch(range(40))


def test_the_default_node_cache_is_a_private_folder_of_the_user(url, small_cache, tmp_path, monkeypatch):
    monkeypatch.delenv("CACHEKIT_LOCAL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ds = CachedDataset(url)
    assert torch.equal(ds.read_batch(range(40))[0], _reference(small_cache)[0])
    root = tmp_path / "xdg" / "cachekit" / "shards"
    assert ds._remote.cache.root == root
    for folder in (tmp_path / "xdg" / "cachekit", root, _folder(root, small_cache)):
        st = folder.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: only absolute paths count
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CachedDataset(url)._remote.cache.root == tmp_path / "home" / ".cache" / "cachekit" / "shards"


@pytest.mark.parametrize("where", ["root", "copies"])
def test_a_folder_another_user_owns_is_refused_in_one_line(url, small_cache, tmp_path, where):
    root = tmp_path / "lc"
    folder = root if where == "root" else _folder(root, small_cache)
    folder.mkdir(parents=True, mode=0o700)
    os.chown(folder, 65534, 65534)  # root may write there all the same: the owner is what counts
    with pytest.raises(UsageError, match=r"owned by uid 65534, not by you") as caught:
        CachedDataset(url, local_cache=root)[0]
    assert "\n" not in str(caught.value)
    assert not list(folder.iterdir())  # nothing was written into it


@pytest.mark.parametrize(
    "mode, who", [(0o777, "its group and others"), (0o703, "others"), (0o770, "its group")]
)
def test_a_folder_others_may_write_in_is_refused(url, tmp_path, mode, who):
    root = tmp_path / "lc"
    root.mkdir()
    root.chmod(mode)
    with pytest.raises(UsageError, match=f"writable by {who}"):
        CachedDataset(url, local_cache=root)


def test_a_link_another_user_planted_as_the_folder_is_refused(url, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "lc"
    link.symlink_to(mine)
    os.lchown(link, 65534, 65534)
    with pytest.raises(UsageError, match="a link owned by uid 65534"):
        CachedDataset(url, local_cache=link)
    os.lchown(link, os.geteuid(), os.getegid())  # the user's own link to their own folder is fine
    assert len(CachedDataset(url, local_cache=link)) == 40


@pytest.mark.parametrize("case", ["file", "read-only", "under-a-file"])
def test_a_local_cache_that_cannot_hold_copies_is_one_line(url, tmp_path, case):
    target = tmp_path / "lc"
    if case == "file":
        target.write_text("not a folder")
        match = "is not a folder"
    elif case == "read-only":
        target.mkdir(mode=0o500)  # root could write there anyway: the mode is what counts
        match = "not readable, writable and searchable by you"
    else:
        (tmp_path / "f").write_text("x")
        target = tmp_path / "f" / "lc"
        match = "a file is in the way"
    with pytest.raises(UsageError, match=match):
        CachedDataset(url, local_cache=target)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1GB", -5, 0, True, [1]])
def test_a_bad_byte_limit_is_one_usage_error(url, tmp_path, value):
    with pytest.raises(UsageError, match="local_cache_bytes must be"):
        CachedDataset(url, local_cache=tmp_path / "lc", local_cache_bytes=value)


def test_a_log_link_never_truncates_what_it_leads_to(url, small_cache, tmp_path):
    folder = _folder(tmp_path / "lc", small_cache)
    folder.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "thesis.pdf"
    victim.write_bytes(os.urandom(1_100_000))  # over the log's 1 MB: today's trim rewrote it
    before = victim.read_bytes()
    (folder / ".downloads.log").symlink_to(victim)
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(ds.read_batch(range(40))[0], _reference(small_cache)[0])
    assert victim.read_bytes() == before
    log = folder / ".downloads.log"
    assert not log.is_symlink() and len(ds._remote.cache.downloads()) == ds.num_shards


def test_a_dangling_marker_link_does_not_create_its_target(url, small_cache, tmp_path):
    folder = _folder(tmp_path / "lc", small_cache)
    folder.mkdir(parents=True, mode=0o700)
    target = tmp_path / "elsewhere" / "created"
    (tmp_path / "elsewhere").mkdir()
    (folder / ".cachekit-shards").symlink_to(target)
    CachedDataset(url, local_cache=tmp_path / "lc")[0]
    assert not target.exists()
    assert stat.S_ISREG(os.lstat(folder / ".cachekit-shards").st_mode)


def test_lock_files_planted_as_links_are_replaced_not_followed(url, small_cache, tmp_path):
    folder = _folder(tmp_path / "lc", small_cache)
    folder.mkdir(parents=True, mode=0o700)
    info = read_manifest(small_cache).shards[0]
    victim = tmp_path / "victim"
    for name in (f".{info.file}.lock", f".{info.file}.download.lock"):
        (folder / name).symlink_to(victim)
    os.mkfifo(folder / f".{read_manifest(small_cache).shards[1].file}.lock")
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(ds.read_batch(range(14))[0], _reference(small_cache)[0][:14])
    assert not victim.exists()
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for p in folder.glob(".*.lock"))


def _corrupt(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A  # same size
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_a_copy_changed_on_the_node_is_fetched_again_never_served(url, small_cache, tmp_path, keep_mtime):
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    ds.read_batch(range(40))
    ds.close()
    copy = ds._remote.cache.path(ds.manifest.shards[0])
    st = copy.stat()
    _corrupt(copy)
    if keep_mtime:  # set back: the change time the kernel keeps still moved
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(again.read_batch(range(40))[0], _reference(small_cache)[0])
    downloads = again._remote.cache.downloads()
    assert downloads.count(copy.name) == 2 and len(downloads) == ds.num_shards + 1


def test_an_unchanged_copy_is_reused_without_a_download_and_a_lost_record_costs_a_rehash(
    url, small_cache, tmp_path, monkeypatch
):
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    ds.read_batch(range(40))
    ds.close()
    cache = ds._remote.cache
    info = ds.manifest.shards[0]
    assert record_path(cache.path(info)).is_file()
    record_path(cache.path(info)).unlink()  # killed between the rename and the record
    hashed = []
    real = shardcache.verified_copy

    def counting(path, size, sha256, *, rehash=True):
        ok = real(path, size, sha256, rehash=rehash)
        hashed.append((path.name, rehash, ok))
        return ok

    monkeypatch.setattr(shardcache, "verified_copy", counting)
    again = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(again.read_batch(range(40))[0], _reference(small_cache)[0])
    assert len(again._remote.cache.downloads()) == ds.num_shards  # nothing fetched again
    assert [h for h in hashed if h[1]] == [(info.file, True, True)]  # one rehash, of that copy only
    assert record_path(cache.path(info)).is_file()


def test_a_read_needing_more_shards_than_fit_fails_at_once(url, small_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(shardcache, "_WAIT_FOR_ROOM_S", 0)  # today's wait: it would end with its own message
    largest = max(s.bytes for s in read_manifest(small_cache).shards)
    ds = CachedDataset(url, local_cache=tmp_path / "lc", local_cache_bytes=3 * largest)
    with pytest.raises(CacheError, match="this process has open at once") as caught:
        ds.read_batch(np.arange(40))  # all 6 shards in one read: its own pins can never be let go
    assert "read indices from fewer shards" in str(caught.value)
    ds.close()
    assert torch.equal(ds.read_batch(range(14))[0], _reference(small_cache)[0][:14])  # two shards fit


def test_a_download_killed_midway_leaves_nothing_that_is_served(url, small_cache, tmp_path):
    """SIGKILL during a download (the .part file half written): the next reader fetches afresh."""
    code = (
        "import os, signal, sys\n"
        "from cachekit import CachedDataset\n"
        "from cachekit.store import remote\n"
        "real = remote.ranged_get\n"
        "def dying(fs, path, target, size=None):\n"
        "    with open(target, 'r+b') as fh:\n"
        "        fh.write(b'x' * 100)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "remote.ranged_get = dying\n"
        "from cachekit.stream import shardcache\n"
        f"CachedDataset(sys.argv[1], local_cache={str(tmp_path / 'lc')!r})[0]\n"
    )
    child = subprocess.run([sys.executable, "-c", code, url], timeout=120)
    assert child.returncode == -9
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(ds.read_batch(range(40))[0], _reference(small_cache)[0])
    folder = ds._remote.cache.folder
    assert not list(folder.glob("*.part")) and len(ds._remote.cache.downloads()) == ds.num_shards


def test_a_record_that_cannot_be_written_costs_a_rehash_not_a_read(url, small_cache, tmp_path, monkeypatch):
    import errno

    def full(path, sha256):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shardcache, "record_verified", full)
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(ds.read_batch(range(40))[0], _reference(small_cache)[0])
    monkeypatch.undo()
    again = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(again.read_batch(range(40))[0], _reference(small_cache)[0])
    assert len(again._remote.cache.downloads()) == ds.num_shards  # verified by hashing, not fetched again


def test_a_link_in_a_copys_place_is_never_served(url, small_cache, tmp_path):
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    ds.read_batch(range(40))
    ds.close()
    copy = ds._remote.cache.path(ds.manifest.shards[0])
    lookalike = tmp_path / "lookalike"
    lookalike.write_bytes(copy.read_bytes())
    copy.unlink()
    copy.symlink_to(lookalike)  # the same bytes, but not a copy the cache made
    again = CachedDataset(url, local_cache=tmp_path / "lc")
    assert torch.equal(again.read_batch(range(40))[0], _reference(small_cache)[0])
    assert not copy.is_symlink() and lookalike.exists()
