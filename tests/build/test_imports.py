"""The modules of ``cachekit/build/`` import one another one way: no circle, discovery below the readers."""

from __future__ import annotations

import ast
from pathlib import Path

import cachekit

BUILD = Path(cachekit.__file__).parent / "build"


def _runtime_imports(tree: ast.AST):
    """The ``from ... import`` nodes of ``tree`` that run (those under ``if TYPE_CHECKING:`` do not)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip.update(id(n) for part in node.body for n in ast.walk(part))
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and id(n) not in skip]


def _graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same folder and its sub-packages it imports (at the top or inside
    functions; those of a sub-package named ``package.module``)."""
    paths = {
        ".".join(p.relative_to(folder).with_suffix("").parts).removesuffix(".__init__"): p
        for p in folder.rglob("*.py")
    }
    graph = {}
    for name, path in paths.items():
        package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
        found = set()
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if not node.level or node.level - 1 > len(package):
                continue
            base = package[: len(package) - (node.level - 1)]
            stems = [".".join([*base, *node.module.split(".")])] if node.module else []
            if not node.module:
                stems = [".".join([*base, a.name]) for a in node.names]
            for stem in stems:
                while stem and stem not in paths:  # a name imported from a module: the module
                    stem = stem.rpartition(".")[0]
                if stem:
                    found.add(stem)
        graph[name] = found - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (strongly connected parts of more than one module)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_build_modules_import_one_way():
    assert _circles(_graph(BUILD)) == []


def test_the_table_of_inputs_imports_no_reader():
    graph = _graph(BUILD)
    assert graph["sources.inputtable"] == {"sources.records"}  # the reader's contract, no reader
    kinds = [m for m in graph if m.startswith("sources.") and m != "sources.discovery"]
    assert len(kinds) >= 12, kinds
    for module in kinds:  # source modules never import discovery back
        assert "sources.discovery" not in graph[module], module


def test_sources_import_nothing_of_the_build_above_them():
    graph = _graph(BUILD)
    sources = [m for m in graph if m == "sources" or m.startswith("sources.")]
    assert len(sources) >= 20, sources
    for module in sources:  # the package is one way: the build imports it, never the reverse
        assert all(m == "sources" or m.startswith("sources.") for m in graph[module]), (module, graph[module])


def test_the_checker_sees_a_circle(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "c.py").write_text("from . import a\n")
    (tmp_path / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import z\n")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    (tmp_path / "p" / "e.py").write_text("from ..d import w\n")
    (tmp_path / "c.py").write_text("from . import a\nfrom .p.e import v\n")
    assert _graph(tmp_path)["d"] == set()  # a type-only import does not run
    assert _circles(_graph(tmp_path)) == [["a", "b"]]
    (tmp_path / "d.py").write_text("from .c import z\n")
    assert _circles(_graph(tmp_path)) == [["a", "b"], ["c", "d", "p.e"]]
