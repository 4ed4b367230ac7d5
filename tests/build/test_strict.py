"""A ``--strict`` build that has to leave inputs out stops with one short line: how many inputs and
annotations, the first five by path with their reasons (each cut short), and where every one is
listed (the manifest of a build without ``--strict``), never a line of thousands of characters."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from cachekit.build.strict import SHOWN, strict_refusal
from cachekit.cli import main
from cachekit.tools.synthetic import make_synthetic_folder

BAD = 30


def _raw(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw, 4, classes=2, size=(32, 40), seed=1)
    for i in range(BAD):  # long names, told apart by their number at the head and the tail
        name = f"{i:03d}_a_rather_long_file_name_that_goes_on_and_on_and_on_{i:03d}.jpg"
        (raw / "class_000" / name).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG after all " * (i + 1))
    return raw


def test_a_strict_build_says_how_many_and_the_first_five_in_one_short_line(tmp_path):
    raw, out = _raw(tmp_path), tmp_path / "c"
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(out), "--quiet", "--strict", "--workers", "1"]
    )
    assert result.exit_code == 1 and not (out / "manifest.json").exists()
    (line,) = result.output.splitlines()
    assert len(line) < 800, len(line)
    head = f"error: --strict: {BAD} inputs could not be used and 0 annotations were left out: "
    tail = f" (the first {SHOWN} of {BAD}); a build without --strict lists them all in its manifest (cachekit info {out})"
    assert line.startswith(head) and line.endswith(tail), line
    shown = line[len(head) : -len(tail)].split("; ")
    assert len(shown) == SHOWN
    for i, entry in enumerate(shown):  # the first five by path, each cut in the middle, its reason whole
        path, reason = entry.split(": ", 1)
        assert len(path) <= 48 and re.fullmatch(rf"class_000/{i:03d}_a_rather\.\.\..*_on_{i:03d}\.jpg", path)
        assert reason == "not a decodable image (its JPEG header gives no size)", reason
    # the place it names lists every one
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(out), "--quiet", "--workers", "1"])
    assert result.exit_code == 0, result.output
    skipped = json.loads((out / "manifest.json").read_text())["skipped"]
    assert len(skipped) == BAD


def test_the_refusal_counts_annotations_too_and_keeps_to_one_line():
    skipped = [("b.jpg", "truncated\nJPEG"), ("a.jpg", "x" * 500)]
    dropped = [("labels/c.txt:3", "a box of no area")]
    line = strict_refusal(skipped, dropped, "cache/")
    assert line == (
        "--strict: 2 inputs could not be used and 1 annotations were left out: "
        f"a.jpg: {'x' * 61}...; b.jpg: truncated JPEG; labels/c.txt:3: a box of no area; a build without "
        "--strict lists them all in its manifest (cachekit info cache/)"
    )
    many = strict_refusal([(f"{i}.jpg", "bad") for i in range(7)], [], "c")
    assert many.count("; ") == SHOWN and f"(the first {SHOWN} of 7)" in many and "5.jpg" not in many
