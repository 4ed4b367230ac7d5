"""The layout is the architecture: each folder imports only the folders below it, data flows one way."""

from __future__ import annotations

import ast
from pathlib import Path

import cachekit

PACKAGE = Path(cachekit.__file__).parent

#: What each folder (or top-level module) may import, besides itself.
ALLOWED = {
    "constants": set(),
    "errors": set(),
    "cpus": set(),
    "lifetime": set(),
    "image": {"errors", "constants"},
    "store": {"errors", "constants", "image"},
    "build": {"errors", "constants", "cpus", "lifetime", "image", "store"},
    "stream": {"errors", "constants", "cpus", "store"},
    "augment": {"errors", "constants", "image"},
    "feed": {"errors", "constants", "cpus", "lifetime", "image", "store", "stream", "augment"},
    "tools": {"errors", "constants", "cpus", "lifetime", "image", "store", "build", "stream", "augment", "feed"},
    "trainers": {"errors", "constants", "cpus", "lifetime", "image", "store", "stream", "augment", "feed"},
}


def _imports(path: Path) -> set[str]:
    """First components (under cachekit) of every cachekit module that ``path`` imports."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    package = parts[:-1] if path.name != "__init__.py" else parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
                if not target:  # "from . import x" at the top level
                    target = [node.names[0].name]
            elif node.module and node.module.split(".")[0] == "cachekit":
                target = node.module.split(".")[1:]
            else:
                continue
            if target:
                found.add(target[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cachekit."):
                    found.add(alias.name.split(".")[1])
    return found


def test_each_folder_imports_only_what_lies_below_it():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        owner = parts[0]
        if owner in ("__init__", "__main__", "cli", "transforms", "pipelines"):
            continue  # the public API and the command line sit on top of everything; recipes are data
        allowed = ALLOWED[owner] | {owner}
        for target in _imports(path) - allowed:
            problems.append(f"{path.relative_to(PACKAGE)} imports cachekit.{target}")
    assert not problems, problems


def test_every_module_is_in_a_folder_the_rules_know():
    top = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    top -= {"__init__", "__main__", "cli", "transforms", "__pycache__", "pipelines"}
    assert top <= set(ALLOWED), top - set(ALLOWED)


def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    fake = tmp_path / "cachekit"
    (fake / "store").mkdir(parents=True)
    (fake / "store" / "bad.py").write_text("from ..feed.loader import make_loader\nfrom . import manifest\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert _imports(fake / "store" / "bad.py") == {"feed", "store"}
