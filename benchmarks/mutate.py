"""Mutation testing of named modules against their narrow tests, in a scratch copy of the tree.

    python benchmarks/mutate.py cachekit/store/fields/base.py --tests tests/store/test_ragged.py
    python benchmarks/mutate.py cachekit/feed/mix.py cachekit/feed/mixorder.py --tests tests/feed/test_mix.py

mutmut 3 (a dev dependency) writes a ``mutants/`` folder beside the code it mutates and reads its settings
from ``pyproject.toml``; running it on a copy keeps the checkout clean and lets the settings name just the
modules and tests of one run. Prints, per module, the mutants killed / all and the survivors' names
(``mutmut show NAME`` in the printed folder shows each one's diff); ``--json`` writes the same figures.
Equivalent mutants (a change that cannot alter behaviour) are named in the closing note of the change,
not hidden here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tree_files() -> list[str]:
    """The checkout's files as git sees them, committed or not (ignored build outputs left out)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def copy_tree(dest: Path) -> list[str]:
    names = tree_files()
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return names


def top_level(names: list[str]) -> list[str]:
    """What mutmut must copy beside the package for the tests to run as in the checkout (``pipelines/``
    is read as ``cachekit.pipelines``, tests read README.md, docs/ and examples/)."""
    tops = {name.split("/", 1)[0] for name in names}
    return sorted(tops - {"cachekit", "tests", "pyproject.toml"})


def settings(modules: list[str], tests: list[str], copy: list[str]) -> str:
    """The ``[tool.mutmut]`` table of one run, as TOML lines."""

    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["cachekit"]\n'
        f"only_mutate = {toml_list(modules)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(tests)}\n"
        'pytest_add_cli_args = ["-x", "-q", "-p", "no:cacheprovider"]\n'
        f"also_copy = {toml_list(copy)}\n"
    )


def with_settings(pyproject: Path, modules: list[str], tests: list[str], copy: list[str]) -> None:
    text = pyproject.read_text()
    if "[tool.mutmut]" in text:  # the checkout's own table is replaced by this run's
        head, _, rest = text.partition("[tool.mutmut]")
        following = rest.find("\n[")
        text = head + (rest[following:] if following >= 0 else "")
    pyproject.write_text(text + settings(modules, tests, copy))
    tomllib.loads(pyproject.read_text())  # a run never starts on settings mutmut would misread


def scores(work: Path) -> dict[str, dict]:
    """Per module: killed, survived, other (timeouts, suspicious, not checked) and the survivors' names."""
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    per: dict[str, Counter] = {}
    survivors: dict[str, list[str]] = {}
    for line in listing.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if not name:
            continue
        module = re.split(r"\.x[_\u01c1]", name, maxsplit=1)[0]  # mutmut names x_func, x\u01c1Class\u01c1method
        per.setdefault(module, Counter())[status] += 1
        if status == "survived":
            survivors.setdefault(module, []).append(name)
    result = {}
    for module, counts in sorted(per.items()):
        total = sum(counts.values())
        result[module] = {
            "killed": counts["killed"],
            "total": total,
            "score": round(counts["killed"] / total, 3) if total else None,
            "counts": dict(counts),
            "survivors": survivors.get(module, []),
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="+", help="files under cachekit/ to mutate")
    parser.add_argument("--tests", action="append", required=True, help="a test file or node id (repeat)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    parser.add_argument("--json", type=Path, help="write the scores to this file")
    args = parser.parse_args()
    for module in args.modules:
        if not (ROOT / module).is_file() or not module.startswith("cachekit/"):
            parser.error(f"{module}: not a module of the package (give paths like cachekit/feed/mix.py)")
    work = Path(tempfile.mkdtemp(prefix="cachekit-mutate-"))
    try:
        names = copy_tree(work)
        with_settings(work / "pyproject.toml", args.modules, args.tests, top_level(names))
        log = work / "mutmut-run.log"  # its progress line redraws itself thousands of times
        with log.open("w") as out:
            run = subprocess.run(
                [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children)],
                cwd=work,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if run.returncode != 0:
            print(log.read_text()[-3000:], file=sys.stderr)
            print(f"mutmut run failed (exit {run.returncode}); the copy is kept at {work}", file=sys.stderr)
            args.keep = True
            return run.returncode
        result = scores(work)
        for module, row in result.items():
            print(f"{module}: {row['killed']}/{row['total']} killed ({row['score']:.0%}) {row['counts']}")
            for name in row["survivors"]:
                print(f"    survived: {name}")
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    finally:
        if args.keep:
            print(f"scratch copy: {work} (mutmut show NAME there)")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
