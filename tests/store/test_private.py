"""Private folders and files that never follow links, checked by owner and mode (root passes every access check)."""

from __future__ import annotations

import os
import stat

import pytest

from cachekit import UsageError
from cachekit.store.private import append_line, open_nofollow, private_folder, read_nofollow, replace_file


def test_missing_folders_are_made_0700_parents_too(tmp_path):
    folder = private_folder(tmp_path / "a" / "b" / "c", "local_cache")
    for p in (tmp_path / "a", tmp_path / "a" / "b", folder):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode, ok", [(0o1777, True), (0o777, False), (0o775, False), (0o755, True)])
def test_a_folder_above_that_others_may_write_in_needs_the_sticky_bit(tmp_path, mode, ok):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)  # others could rename the private folder away and put theirs in its place
    if ok:
        private_folder(shared / "mine", "local_cache")
    else:
        with pytest.raises(UsageError, match="which others may write in"):
            private_folder(shared / "mine", "local_cache")


def test_a_folder_above_owned_by_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    (theirs / "mine").mkdir(mode=0o700)
    with pytest.raises(UsageError, match="which uid 65534 owns"):
        private_folder(theirs / "mine", "local_cache")


def test_files_are_never_reached_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "log"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        open_nofollow(link, os.O_RDWR | os.O_CREAT)
    assert read_nofollow(link) is None
    append_line(link, "one line\n", 1 << 20)  # the link itself is replaced by a log
    assert victim.read_text() == "keep" and not link.is_symlink() and link.read_text() == "one line\n"
    (tmp_path / "marker").symlink_to(tmp_path / "never-made")
    replace_file(tmp_path / "marker", b"mark")
    assert not (tmp_path / "never-made").exists() and (tmp_path / "marker").read_bytes() == b"mark"


def test_a_fifo_in_a_files_place_neither_blocks_nor_is_read(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert read_nofollow(tmp_path / "fifo") is None
    with pytest.raises(OSError):
        open_nofollow(tmp_path / "fifo", os.O_RDWR)
    append_line(tmp_path / "fifo", "x\n", 1 << 20)
    assert (tmp_path / "fifo").read_text() == "x\n"


def test_a_log_past_its_size_keeps_its_newer_half(tmp_path):
    log = tmp_path / "log"
    for i in range(200):
        append_line(log, f"line {i:04d}\n", 1000)
    lines = log.read_text().splitlines()
    assert lines[-1] == "line 0199" and log.stat().st_size <= 1000 + 10 and len(lines) > 40
