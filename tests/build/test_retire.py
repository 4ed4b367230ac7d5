"""What a build removes: only what the cache recorded, never its inputs, and every leftover of a killed run."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, UsageError, build, read_manifest
from cachekit.build import cacherun as run_module
from cachekit.cli import main
from cachekit.tools.verify import verify

CONFIG = dict(size=16, shard_size=5, workers=1, progress=False)


def _user_files(out):
    (out / "shard-000000.tar").write_bytes(b"mine")
    (out / "shard-userfolder").mkdir()
    (out / "shard-userfolder" / "data.bin").write_bytes(b"mine too")
    (out / "notes.txt").write_text("keep")
    (out / "shard-abc.pt.json").write_text("{}")
    (out / ".hidden.123.tmp").write_text("a user's temp file, not cachekit's")
    (out / ".shard-notes.2024.tmp").write_text("looks like a temp shard, is not")
    (out / ".manifest.json.backup.1.tmp").write_text("a user's backup")


def _user_files_intact(out) -> bool:
    return (
        (out / "shard-000000.tar").read_bytes() == b"mine"
        and (out / "shard-userfolder" / "data.bin").read_bytes() == b"mine too"
        and (out / "notes.txt").read_text() == "keep"
        and (out / "shard-abc.pt.json").read_text() == "{}"
        and (out / ".hidden.123.tmp").exists()
        and (out / ".shard-notes.2024.tmp").exists()
        and (out / ".manifest.json.backup.1.tmp").exists()
    )


def test_overwrite_removes_only_what_the_cache_recorded(small_tree, tmp_path):
    out = tmp_path / "c"
    old = build(small_tree, out, BuildConfig(**CONFIG)).manifest
    _user_files(out)
    build(small_tree, out, BuildConfig(**{**CONFIG, "size": 20}, overwrite=True, grace=0))
    assert _user_files_intact(out)
    assert not any((out / s.file).exists() for s in old.shards)
    names = {p.name for p in out.iterdir()}
    assert names == {
        "manifest.json",
        read_manifest(out).index["file"],
        *(s.file for s in read_manifest(out).shards),
        "shard-000000.tar",
        "shard-userfolder",
        "notes.txt",
        "shard-abc.pt.json",
        ".hidden.123.tmp",
        ".shard-notes.2024.tmp",
        ".manifest.json.backup.1.tmp",
    }


def test_a_folder_of_user_files_needs_overwrite_and_keeps_them(small_tree, tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    _user_files(out)
    with pytest.raises(UsageError, match="not empty"):
        build(small_tree, out, BuildConfig(**CONFIG))
    build(small_tree, out, BuildConfig(**CONFIG, overwrite=True))
    assert _user_files_intact(out) and verify(out).ok


@pytest.mark.parametrize("where", ["same", "out-inside-raw", "raw-inside-out"])
def test_raw_and_out_must_be_apart(small_tree, tmp_path, where):
    raw = tmp_path / "data" / "raw"
    shutil.copytree(small_tree, raw)
    out = {"same": raw, "out-inside-raw": raw / "cache", "raw-inside-out": tmp_path / "data"}[where]
    before = sorted(p for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(out), "--overwrite", "--quiet"])
    assert result.exit_code == 2 and ("inside" in result.output or "itself" in result.output), result.output
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, nothing removed


def _kill_at(monkeypatch, name: str, calls: int = 1, before: bool = False):
    """Raise KeyboardInterrupt at the ``calls``-th call of ``run.<name>`` (before or after it runs)."""
    real, seen = getattr(run_module, name), []

    def killed(*args, **kwargs):
        seen.append(1)
        if before and len(seen) == calls:
            raise KeyboardInterrupt
        result = real(*args, **kwargs)
        if not before and len(seen) == calls:
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(run_module, name, killed)


#: Where a build can die in its last steps: (step, before or after it).
KILL_POINTS = [
    ("write_sidecar", False),  # a shard finished
    ("retire", True),  # every shard finished, nothing recorded yet
    ("retire", False),  # old shards recorded as retired, old manifest still in place
    ("manifest_text", False),  # about to write the manifest
    ("remove_unrecorded_plan", True),  # right after the manifest write
    ("collect", True),  # resume records removed, retired shards not yet looked at
]


@pytest.mark.parametrize(
    "point, before", KILL_POINTS, ids=[f"{'before' if b else 'after'}-{p}" for p, b in KILL_POINTS]
)
def test_a_rerun_after_a_kill_at_any_point_cleans_every_leftover(
    small_tree, tmp_path, monkeypatch, point, before
):
    raw, out = tmp_path / "raw", tmp_path / "c"
    shutil.copytree(small_tree, raw)
    build(raw, out, BuildConfig(**CONFIG))
    (raw / "class_000" / "img_0000000.jpg").unlink()
    shutil.copy(raw / "class_001" / "img_0000001.jpg", raw / "class_003" / "new.jpg")
    update = BuildConfig(**CONFIG, update=True, grace=3600)
    with monkeypatch.context() as patch:
        _kill_at(patch, point, before=before)
        with pytest.raises(KeyboardInterrupt):
            build(raw, out, update)
    assert verify(out).ok  # whichever version the manifest names, it is whole
    again = build(raw, out, update)
    assert again.status in ("updated", "up to date", "resumed")
    m = read_manifest(out)
    fresh = build(raw, tmp_path / "fresh", BuildConfig(**CONFIG, shards=m.order["shards"]))
    assert fresh.manifest.to_json() | {"created": ""} == m.to_json() | {"created": ""}
    record = out / ".cachekit-retired.json"
    retired = set(json.loads(record.read_text())["files"]) if record.exists() else set()
    names = {p.name for p in out.iterdir()}
    assert names == {"manifest.json", m.index["file"], *(s.file for s in m.shards), *retired} | (
        {record.name} if retired else set()
    )
    assert retired and not retired & {s.file for s in m.shards}  # the replaced shards, kept for old readers


def _abandon_an_overwrite(small_tree, out, monkeypatch):
    """A cache, then an --overwrite with other options killed after two shards: the first manifest."""
    first = build(small_tree, out, BuildConfig(**CONFIG)).manifest
    with monkeypatch.context() as patch:
        _kill_at(patch, "write_sidecar", calls=2)
        with pytest.raises(KeyboardInterrupt):
            build(small_tree, out, BuildConfig(**{**CONFIG, "size": 12}, overwrite=True))
    return first


def test_an_abandoned_build_of_other_options_is_cleaned_by_the_next(small_tree, tmp_path, monkeypatch):
    out = tmp_path / "c"
    first = _abandon_an_overwrite(small_tree, out, monkeypatch)
    abandoned = {p.name for p in out.glob("shard-*")} - {s.file for s in first.shards}
    assert len(abandoned) == 2
    _user_files(out)
    build(small_tree, out, BuildConfig(**{**CONFIG, "size": 20}, overwrite=True))
    names = {p.name for p in out.iterdir()}
    assert not abandoned & names  # never referenced by any manifest: removed at once
    assert {s.file for s in first.shards} <= names  # referenced by the replaced version: retired
    assert _user_files_intact(out)


def test_an_up_to_date_run_cleans_what_an_abandoned_build_of_other_options_left(
    small_tree, tmp_path, monkeypatch
):
    out = tmp_path / "c"
    first = _abandon_an_overwrite(small_tree, out, monkeypatch)
    assert (out / ".cachekit-partial").exists()
    assert build(small_tree, out, BuildConfig(**CONFIG)).status == "up to date"  # the cache's own command
    assert {p.name for p in out.iterdir()} == {
        "manifest.json",
        first.index["file"],
        *(s.file for s in first.shards),
    }


def test_temp_files_of_a_killed_run_are_removed_by_the_next(small_tree, tmp_path):
    out = tmp_path / "c"
    build(small_tree, out, BuildConfig(**CONFIG))
    temps = [
        ".shard-0123456789abcdef0123.pt.4242.tmp",
        ".manifest.json.4242.tmp",
        "..cachekit-retired.json.4242.tmp",
    ]
    for name in temps:
        (out / name).write_bytes(b"half")
    (out / ".shard-0123456789abcdef0124.zarr.4242.tmp").mkdir()
    assert build(small_tree, out, BuildConfig(**CONFIG)).status == "up to date"
    m = read_manifest(out)
    assert {p.name for p in out.iterdir()} == {"manifest.json", m.index["file"], *(s.file for s in m.shards)}


#: Entries a hostile or damaged record may hold: none names a shard this cache may remove.
NOT_SHARDS = [
    "manifest.json",
    "notes.txt",
    "shard-000000.tar",
    "shard-userfolder",
    "../outside.txt",
    "/etc/passwd",
    ".cachekit.lock",
    "shard-abc.pt.json",
]


def test_a_retired_record_naming_anything_but_a_shard_deletes_nothing(small_tree, tmp_path, caplog):
    out = tmp_path / "c"
    m = build(small_tree, out, BuildConfig(**CONFIG)).manifest
    _user_files(out)
    (tmp_path / "outside.txt").write_text("outside")
    entries = {name: 0 for name in NOT_SHARDS} | {m.shards[0].file: 0}  # referenced: never removed
    (out / ".cachekit-retired.json").write_text(json.dumps({"files": entries}))
    result = CliRunner().invoke(
        main,
        [
            "build",
            str(small_tree),
            "--out",
            str(out),
            "--size",
            "16",
            "--shard-size",
            "5",
            "--workers",
            "1",
            "--quiet",
        ],
    )
    assert result.exit_code == 0 and "up to date" in result.output, result.output
    assert read_manifest(out) == m and verify(out).ok
    assert _user_files_intact(out) and (tmp_path / "outside.txt").read_text() == "outside"
    assert "not shard file names" in caplog.text and "manifest.json" in caplog.text
    assert not (out / ".cachekit-retired.json").exists()  # nothing left in it worth keeping


@pytest.mark.parametrize("abandoned", [True, False], ids=["other-fingerprint", "this-fingerprint"])
def test_a_partial_record_naming_anything_but_a_shard_deletes_nothing(
    small_tree, tmp_path, caplog, abandoned
):
    out = tmp_path / "c"
    m = build(small_tree, out, BuildConfig(**CONFIG)).manifest
    _user_files(out)
    (out / ".cachekit-partial").mkdir()
    state = {"fingerprint": "0" * 64 if abandoned else m.fingerprint, "planned": NOT_SHARDS}
    (out / ".cachekit-partial" / "state.json").write_text(json.dumps(state))
    (out / ".cachekit-partial" / "notes.txt.json").write_text("{}")
    assert build(small_tree, out, BuildConfig(**CONFIG)).status == "up to date"
    assert _user_files_intact(out) and read_manifest(out) == m and verify(out).ok
    assert not (out / ".cachekit-partial").exists()
    assert "not shard file names" in caplog.text


def test_records_reached_through_a_link_are_never_followed(small_tree, tmp_path):
    out, elsewhere = tmp_path / "c", tmp_path / "elsewhere"
    m = build(small_tree, out, BuildConfig(**CONFIG)).manifest
    elsewhere.mkdir()
    (elsewhere / "state.json").write_text(json.dumps({"fingerprint": "0" * 64, "planned": []}))
    (elsewhere / "precious.json").write_text("keep")
    (out / ".cachekit-partial").symlink_to(elsewhere)
    assert build(small_tree, out, BuildConfig(**CONFIG)).status == "up to date"
    build(small_tree, out, BuildConfig(**{**CONFIG, "size": 20}, overwrite=True, grace=0))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious.json", "state.json"]
    assert (elsewhere / "precious.json").read_text() == "keep"
    assert not (out / ".cachekit-partial").exists() and verify(out).ok
    assert not any((out / s.file).exists() for s in m.shards)


@pytest.mark.parametrize("state", ["missing", "garbage"])
def test_records_whose_plan_was_lost_are_removed_by_any_later_run(small_tree, tmp_path, state):
    """A kill while a finished build removed its records (the plan gone, sidecars left): the next
    "up to date" run removes them, and the shards they name that no manifest references."""
    out = tmp_path / "c"
    m = build(small_tree, out, BuildConfig(**CONFIG)).manifest
    partial = out / ".cachekit-partial"
    partial.mkdir()
    orphan = "shard-0123456789abcdef0123.pt"  # finished by the killed run, in no manifest
    (out / orphan).write_bytes(b"a shard no manifest names")
    for name in (m.shards[0].file, orphan):
        (partial / f"{name}.json").write_text("{}")
    if state == "garbage":
        (partial / "state.json").write_text("{not json")
    assert build(small_tree, out, BuildConfig(**CONFIG)).status == "up to date"
    assert {p.name for p in out.iterdir()} == {"manifest.json", m.index["file"], *(s.file for s in m.shards)}
    assert verify(out).ok


def test_records_are_removed_plan_last(small_tree, tmp_path, monkeypatch):
    """Killed at any record while a finished build removes them, its plan is still there to read."""
    from cachekit.store.location import LocalLocation

    out = tmp_path / "c"
    with monkeypatch.context() as patch:
        _kill_at(patch, "remove_unrecorded_plan", before=True)
        with pytest.raises(KeyboardInterrupt):
            build(small_tree, out, BuildConfig(**CONFIG))
    real, removed = LocalLocation.remove, []

    def dying(self, name):
        removed.append(name)
        if name == ".cachekit-partial/state.json":
            raise KeyboardInterrupt
        real(self, name)

    with monkeypatch.context() as patch:
        patch.setattr(LocalLocation, "remove", dying)
        with pytest.raises(KeyboardInterrupt):
            build(small_tree, out, BuildConfig(**CONFIG))
    sidecars = [n for n in removed if n.endswith(".pt.json")]
    assert sidecars and removed.index(".cachekit-partial/state.json") > max(map(removed.index, sidecars))
    assert build(small_tree, out, BuildConfig(**CONFIG)).status == "up to date"
    assert not (out / ".cachekit-partial").exists()
