"""Every ``pip install`` line the project shows (messages and docstrings under cachekit/, the
examples and benchmarks, README, docs/ and the Dockerfile) installs what it means to: this
distribution under its own name (``cachekit`` on the package index is an unrelated project) with
extras it declares, a clone (``.``, ``'.[x]'``), or a known third-party package."""

from __future__ import annotations

import ast
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

from cachekit.constants import DIST_NAME
from cachekit.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])

#: Third-party distributions an install line may name besides those pyproject.toml declares
#: (PyTorch builds, the packages of the benchmarks' comparison environments, optional codecs).
THIRD_PARTY = {
    "torch",
    "torchvision",
    "ultralytics",
    "hdf5plugin",
    "nvidia-ml-py",
    "numba",
    "assertpy",
    "fastargs",
    "psutil",
    "pytorch-pfn-extras",
    "terminaltables",
    "ffcv",
}

#: Options of ``pip install`` that take a value which is not a requirement.
_VALUE_OPTIONS = {"--index-url", "-i", "--extra-index-url", "-r", "--requirement", "-c", "--constraint", "-f"}
_PIP_INSTALL = re.compile(r"\bpip3?\s+install\s")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRAS = re.compile(r"^[^\[]*\[([^\]]*)\]")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    """The distributions pyproject.toml names (dependencies and every extra)."""
    reqs = list(PYPROJECT["project"]["dependencies"])
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        reqs += extra
    return {_normal(_NAME.match(r).group()) for r in reqs}


KNOWN = {_normal(n) for n in THIRD_PARTY} | _declared()


def install_targets(segment: str) -> list[str]:
    """The requirements of each ``pip install`` command in ``segment`` (one shell line, a code span
    or one string), options and their values left out; cut at ``&&``, ``;``, ``|`` and comments."""
    found = []
    for match in _PIP_INSTALL.finditer(segment):
        rest = re.split(r"&&|;|\|| #|``|\n", segment[match.end() :])[0]
        try:
            tokens = shlex.split(rest)
        except ValueError:  # an unbalanced quote: the words as written
            tokens = [t.strip("'\"") for t in rest.split()]
        skip = False
        for token in tokens:
            if skip:
                skip = False
            elif token in _VALUE_OPTIONS:
                skip = True
            elif token.startswith("-") or token.startswith("$"):
                continue
            else:
                found.append(token)
    return found


def problem(target: str) -> str | None:
    """Why one ``pip install`` requirement is wrong, or None."""
    extras = _EXTRAS.match(target)
    wanted = {e.strip() for e in extras.group(1).split(",")} if extras else set()
    if target.startswith((".", "/")):  # a clone: '.', '.[dev]', './'
        return (
            f"{target!r} asks for extras {sorted(wanted - EXTRAS)} that pyproject.toml lacks"
            if wanted - EXTRAS
            else None
        )
    name = _NAME.match(target)
    if name is None:
        return f"{target!r} names no distribution"
    dist = _normal(name.group())
    if dist == _normal(DIST_NAME):
        if wanted - EXTRAS:
            return f"{target!r} asks for extras {sorted(wanted - EXTRAS)} that pyproject.toml lacks"
        return None
    if dist.startswith("cachekit"):
        return f"{target!r} installs {dist!r} from the package index, not this project ({DIST_NAME})"
    if dist not in KNOWN:
        return f"{target!r}: {dist!r} is neither this project nor a known third-party package"
    return None


def _rendered(node: ast.JoinedStr) -> str:
    """An f-string's text with ``DIST_NAME`` filled in and any other field left as ``{}``."""
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value))
        elif isinstance(part.value, ast.Name | ast.Attribute) and ast.unparse(part.value).endswith(
            "DIST_NAME"
        ):
            out.append(DIST_NAME)
        else:
            out.append("{}")
    return "".join(out)


def python_strings(path: Path) -> list[str]:
    """Every string literal of a module (docstrings included), f-strings rendered whole."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in ast.walk(node)}
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append(_rendered(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inner:
            texts.append(node.value)
    return texts


def markdown_code(text: str) -> list[str]:
    """A Markdown file's code: each line of its fenced blocks, each inline span; then the prose,
    which must hold no install line outside code."""
    segments = []
    fences = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    for block in fences.findall(text):
        segments += block.replace("\\\n", " ").splitlines()
    prose = fences.sub("", text)
    spans = re.compile(r"(`+)(.+?)\1", re.S)
    segments += [m.group(2) for m in spans.finditer(prose)]
    segments.append(spans.sub("", prose))
    return segments


def _sources() -> dict[str, list[str]]:
    found = {}
    for folder in ("cachekit", "examples", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found[str(path.relative_to(ROOT))] = python_strings(path)
    for path in [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "benchmarks").glob("*.md")),
    ]:
        found[str(path.relative_to(ROOT))] = markdown_code(path.read_text(encoding="utf-8"))
    docker = ROOT / "Dockerfile"
    if docker.exists():
        found["Dockerfile"] = docker.read_text(encoding="utf-8").replace("\\\n", " ").splitlines()
    return found


def test_the_checker_tells_our_name_from_the_unrelated_one():
    assert install_targets("error: reading Parquet needs pyarrow: pip install 'cachekit[parquet]'") == [
        "cachekit[parquet]"
    ]
    assert install_targets(
        "pip install --index-url https://x/y torch -e '.[dev]' && pip install cachekit"
    ) == [
        "torch",
        ".[dev]",
        "cachekit",
    ]
    assert problem("cachekit[parquet]") and problem("cachekit") and problem("cachekit_vision2")
    assert (
        problem(f"{DIST_NAME}[parquet]") is None and problem(".[plot,dask]") is None and problem(".") is None
    )
    assert problem(f"{DIST_NAME}[parqet]") and problem(".[nosuchextra]")
    assert problem("torch==2.13.0") is None and problem("zarr>=3") is None
    assert problem("pyarrrow") is not None  # a misspelt or unknown name is not waved through
    assert "pip install 'cachekit[x]'" in markdown_code("Parquet needs `pip install 'cachekit[x]'`.")
    assert install_targets(markdown_code("so\n`pip\n  install -e .`, then")[0]) == ["."]


def test_every_install_line_names_this_distribution_or_a_known_one():
    bad, seen = [], {}
    for where, segments in _sources().items():
        for segment in segments:
            for target in install_targets(segment):
                seen.setdefault(where, []).append(target)
                if (why := problem(target)) is not None:
                    bad.append(f"{where}: {why}")
    assert bad == []
    # the scan reaches the messages, the README and the docs (a scan that finds nothing passes nothing)
    assert f"{DIST_NAME}[parquet]" in seen["cachekit/build/sources/parquet.py"]
    assert f"{DIST_NAME}[plot]" in seen["cachekit/tools/benchview.py"]
    assert (
        f"{DIST_NAME}[parquet]" in seen["README.md"] and f"{DIST_NAME}[parquet]" in seen["docs/BUILDING.md"]
    )


def test_no_install_line_in_prose_outside_code():
    for where in ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]:
        prose = markdown_code((ROOT / where).read_text(encoding="utf-8"))[-1]
        assert not _PIP_INSTALL.search(prose), where


def test_the_missing_pyarrow_message_names_this_distribution_and_its_extra(monkeypatch):
    from cachekit.build.sources import parquet as parquetsource

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UsageError) as err:
        parquetsource._pyarrow()
    assert str(err.value) == f"reading Parquet needs pyarrow: pip install '{DIST_NAME}[parquet]'"
    assert any(r.startswith("pyarrow") for r in PYPROJECT["project"]["optional-dependencies"]["parquet"])
    assert PYPROJECT["project"]["name"] == DIST_NAME


def test_the_missing_hdf5plugin_message_names_the_extra_that_brings_it(monkeypatch):
    from cachekit.store.formats import hdf5

    monkeypatch.setitem(sys.modules, "hdf5plugin", None)
    with pytest.raises(UsageError) as err:
        hdf5.Hdf5Format().check_options({"compression": "zstd"})
    assert str(err.value) == f"HDF5 zstd/lz4 compression needs hdf5plugin: pip install '{DIST_NAME}[hdf5]'"
    assert any(r.startswith("hdf5plugin") for r in PYPROJECT["project"]["optional-dependencies"]["hdf5"])
