"""The command line: exit codes and one-line errors a user can act on."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import BAD_FILES

from cachekit.cli import main


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_build_then_info(small_tree, tmp_path):
    code, out = run("build", small_tree, "--out", tmp_path / "c", "--size", 32, "--workers", 1, "--quiet")
    assert code == 0, out
    assert "40 samples, 0 skipped" in out
    code, out = run("info", tmp_path / "c")
    assert code == 0 and "uint8 [3, 32, 32]" in out and "class_000" in out


def test_bad_files_are_reported_and_strict_fails(mixed_tree, tmp_path):
    code, out = run("build", mixed_tree, "--out", tmp_path / "c", "--size", 32, "--quiet")
    assert code == 0 and f"{len(BAD_FILES)} skipped" in out
    code, out = run("build", mixed_tree, "--out", tmp_path / "s", "--size", 32, "--quiet", "--strict")
    assert code == 1
    for path in BAD_FILES:
        assert path in out
    assert not (tmp_path / "s" / "manifest.json").exists()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing-raw", "does not exist"),
        ("no-images", "holds no images"),
        ("unknown-pipeline", "unknown pipeline"),
        ("unknown-format", "unknown format"),
        ("non-empty-out", "not empty"),
    ],
)
def test_user_errors_exit_2_with_one_line(case, message, small_tree, tmp_path):
    raw, out, extra = small_tree, tmp_path / "out", []
    if case == "missing-raw":
        raw = tmp_path / "nope"
    elif case == "no-images":
        raw = tmp_path / "empty"
        raw.mkdir()
        (raw / "readme.txt").write_text("x")
    elif case == "unknown-pipeline":
        extra = ["--pipeline", "sepia-9000"]
    elif case == "unknown-format":
        extra = ["--format", "parquet"]
    else:
        out.mkdir()
        (out / "precious.txt").write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-m", "cachekit.cli", "build", str(raw), "--out", str(out), *extra],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    if case == "non-empty-out":
        assert (out / "precious.txt").read_text() == "mine"


def test_info_on_a_non_cache_exits_1(tmp_path):
    code, out = run("info", tmp_path)
    assert code == 1 and "no manifest.json" in out
