"""The modules of ``cachekit/build/`` import one another one way: no circle, discovery below the readers."""

from __future__ import annotations

import ast
from pathlib import Path

import cachekit

BUILD = Path(cachekit.__file__).parent / "build"


def _graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same folder it imports (at the top or inside functions)."""
    names = {p.stem for p in folder.glob("*.py")}
    graph = {}
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names)
        graph[path.stem] = found & names - {path.stem}
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
    assert _graph(BUILD)["inputtable"] == set()
    for reader in ("annotate", "labels", "yolo", "coco", "remotesource"):
        assert "sources" not in _graph(BUILD)[reader], reader


def test_the_checker_sees_a_circle(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "c.py").write_text("from . import a\n")
    assert _circles(_graph(tmp_path)) == [["a", "b"]]
