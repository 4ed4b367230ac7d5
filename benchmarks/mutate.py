"""Mutation testing of named modules against their narrow tests, in a scratch copy of the tree.

    python benchmarks/mutate.py cachekit/store/fields/base.py --tests tests/store/test_ragged.py
    python benchmarks/mutate.py cachekit/feed/mix.py cachekit/feed/mixorder.py --tests tests/feed/test_mix.py
    python benchmarks/mutate.py cachekit/augment/maps.py --tests tests/augment/test_walk.py
        --only 'cachekit.augment.maps.x_draw_maps*' --sample 60 --max-children 1 --base HEAD  (one line)

mutmut 3 (a dev dependency) writes a ``mutants/`` folder beside the code it mutates and reads its settings
from ``pyproject.toml``; running it on a copy keeps the checkout clean and lets the settings name just the
modules and tests of one run. Prints, per module, the mutants killed / all and the survivors' names
(``mutmut show NAME`` in the printed folder shows each one's diff); ``--json`` writes the same figures.
Equivalent mutants (a change that cannot alter behaviour) are named in the closing note of the change,
not hidden here.

mutmut runs each mutant's tests in a forked child: a test that starts processes of its own (a DataLoader
with workers, ``torch.multiprocessing.spawn``, a process pool) hangs there, so ``--deselect`` leaves it out
(pytest's node id, repeat). OpenCV and BLAS thread pools do not survive the fork either: the run sets
``OMP_NUM_THREADS=1`` and ``OPENCV_FOR_THREADS_NUM=1`` (``MUTATE_ENV``). ``--only`` (mutant name patterns,
fnmatch, as ``mutmut results`` prints them) and ``--sample N`` (N of them drawn with ``--sample-seed``)
bound a run on a module of hundreds of mutants; the scores then count the mutants run alone.
``--base REV`` copies the tree as committed at REV, with the mutated modules and the named test files
from the working tree: files others are editing in the same checkout cannot break the run (a named
test file edited for code not yet committed still can: ``--deselect`` its test, or commit first).
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Set for every mutmut run: thread pools started before mutmut forks a mutant's tests hang the child.
MUTATE_ENV = {"OMP_NUM_THREADS": "1", "OPENCV_FOR_THREADS_NUM": "1"}


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


def copy_committed(dest: Path, rev: str, own: list[str]) -> list[str]:
    """The tree as committed at ``rev``, then the files of ``own`` (the mutated modules, the tests
    named) as they are in the working tree."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(dest, members=members, filter="data")
    names = {m.name for m in members}
    for name in own:
        if (ROOT / name).is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
            names.add(name)
    return sorted(names)


def top_level(names: list[str]) -> list[str]:
    """What mutmut must copy beside the package for the tests to run as in the checkout (``pipelines/``
    is read as ``cachekit.pipelines``, tests read README.md, docs/ and examples/)."""
    tops = {name.split("/", 1)[0] for name in names}
    return sorted(tops - {"cachekit", "tests", "pyproject.toml"})


def settings(modules: list[str], tests: list[str], copy: list[str], deselect: list[str] = ()) -> str:
    """The ``[tool.mutmut]`` table of one run, as TOML lines."""

    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    pytest_args = ["-x", "-q", "-p", "no:cacheprovider"] + [arg for node in deselect for arg in ("--deselect", node)]

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["cachekit"]\n'
        f"only_mutate = {toml_list(modules)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(tests)}\n"
        f"pytest_add_cli_args = {toml_list(pytest_args)}\n"
        f"also_copy = {toml_list(copy)}\n"
    )


def with_settings(
    pyproject: Path, modules: list[str], tests: list[str], copy: list[str], deselect: list[str] = ()
) -> None:
    text = pyproject.read_text()
    if "[tool.mutmut]" in text:  # the checkout's own table is replaced by this run's
        head, _, rest = text.partition("[tool.mutmut]")
        following = rest.find("\n[")
        text = head + (rest[following:] if following >= 0 else "")
    pyproject.write_text(text + settings(modules, tests, copy, deselect))
    tomllib.loads(pyproject.read_text())  # a run never starts on settings mutmut would misread


def mutant_names(work: Path, modules: list[str]) -> list[str]:
    """Every mutant mutmut makes of ``modules`` (its names, as ``mutmut results`` prints them)."""
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from mutmut.mutation.file_mutation import mutate_file_contents\n"
        "from mutmut.utils.format_utils import get_mutant_name\n"
        "names = []\n"
        "for path in sys.argv[1:]:\n"
        "    made = mutate_file_contents(path, Path(path).read_text())\n"
        "    names += [get_mutant_name(Path(path), name) for name in made.mutant_names]\n"
        "print(json.dumps(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, *modules], cwd=work, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def chosen(names: list[str], only: list[str] | None, sample: int | None, seed: int) -> list[str]:
    """The mutants matching ``only`` (all without it), ``sample`` of them drawn with ``seed``."""
    if only:
        names = [name for name in names if any(fnmatch.fnmatch(name, pattern) for pattern in only)]
    if sample is not None and sample < len(names):
        names = sorted(random.Random(seed).sample(names, sample))
    return names


def scores(work: Path, selected: list[str] | None = None) -> dict[str, dict]:
    """Per module: killed, survived, other (timeouts, suspicious, not checked) and the survivors' names;
    of the ``selected`` mutants alone when given."""
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
        if not name or (selected is not None and name not in selected):
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
    parser.add_argument("--deselect", action="append", default=[], help="a test node id to leave out (repeat)")
    parser.add_argument("--only", action="append", help="mutant names to run, fnmatch patterns (repeat)")
    parser.add_argument("--sample", type=int, help="run this many of the (--only) mutants, drawn at random")
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--base", metavar="REV", help="copy the tree as committed at REV (the modules and tests named as they are)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    parser.add_argument("--json", type=Path, help="write the scores to this file")
    args = parser.parse_args()
    for module in args.modules:
        if not (ROOT / module).is_file() or not module.startswith("cachekit/"):
            parser.error(f"{module}: not a module of the package (give paths like cachekit/feed/mix.py)")
    work = Path(tempfile.mkdtemp(prefix="cachekit-mutate-"))
    try:
        if args.base:
            own = args.modules + [test.split("::", 1)[0] for test in args.tests]
            names = copy_committed(work, args.base, own)
        else:
            names = copy_tree(work)
        with_settings(work / "pyproject.toml", args.modules, args.tests, top_level(names), args.deselect)
        selected = None
        if args.only or args.sample is not None:
            selected = chosen(mutant_names(work, args.modules), args.only, args.sample, args.sample_seed)
            if not selected:
                parser.error("no mutant matches --only")
        log = work / "mutmut-run.log"  # its progress line redraws itself thousands of times
        with log.open("w") as out:
            run = subprocess.run(
                [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children), *(selected or [])],
                cwd=work,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **MUTATE_ENV},
            )
        if run.returncode != 0:
            print(log.read_text()[-3000:], file=sys.stderr)
            print(f"mutmut run failed (exit {run.returncode}); the copy is kept at {work}", file=sys.stderr)
            args.keep = True
            return run.returncode
        result = scores(work, set(selected) if selected is not None else None)
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
