"""What cachekit imports, pyproject.toml declares: a module imported at a module's top level is a
dependency; one imported inside a function is a dependency or belongs to an extra, and then at
least one of its imports is guarded (a one-line "needs X" error naming the extra, or a feature that
turns itself off). Nothing arrives only because another package happens to depend on it."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

import cachekit
from cachekit.constants import DIST_NAME

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(cachekit.__file__).parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

#: Modules of optional packages this environment may lack, and the distribution that provides each.
NOT_INSTALLED = {
    "hdf5plugin": "hdf5plugin",
    "pynvml": "nvidia-ml-py",
    "pyarrow": "pyarrow",
    "dask": "dask",
    "fsspec": "fsspec",
    "matplotlib": "matplotlib",
}
#: Handlers that catch a failed import.
_CATCHES_IMPORT = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(reqs: list[str]) -> set[str]:
    return {_normal(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r).group()) for r in reqs}


DEPENDENCIES = _names(PROJECT["dependencies"])
EXTRAS = {name: _names(reqs) for name, reqs in PROJECT["optional-dependencies"].items() if name != "dev"}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str) -> set[str]:
    """The distributions that provide a top-level module (normalised names)."""
    found = _installed().get(module) or [NOT_INSTALLED.get(module, "")]
    dists = {_normal(d) for d in found if d}
    assert dists, f"which distribution provides {module!r}? (add it to NOT_INSTALLED)"
    return dists


class _Import:
    def __init__(self, module: str, where: str, lazy: bool, guard: ast.ExceptHandler | None) -> None:
        self.module, self.where, self.lazy, self.guard = module, where, lazy, guard


def _catches_import(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in _CATCHES_IMPORT for t in types)


def imports_of(source: str, where: str) -> list[_Import]:
    """Every import of a module outside the standard library and cachekit: whether it sits in a
    function, and the handler of the innermost ``try`` around it that catches a failed import."""
    found: list[_Import] = []

    def visit(node: ast.AST, lazy: bool, guard: ast.ExceptHandler | None) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules if getattr(node, "level", 0) == 0 else []:
                top = module.split(".")[0]
                if top and top not in sys.stdlib_module_names and top != "cachekit":
                    found.append(_Import(top, f"{where}:{node.lineno}", lazy, guard))
            return
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for child in node.orelse:  # annotations only: never imported when the code runs
                visit(child, lazy, guard)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            lazy = True
        if isinstance(node, ast.Try | ast.TryStar):
            handler = next((h for h in node.handlers if _catches_import(h)), None)
            for child in node.body:
                visit(child, lazy, handler or guard)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, lazy, guard)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, lazy, guard)

    visit(ast.parse(source), False, None)
    return found


def _message(handler: ast.ExceptHandler) -> str | None:
    """The text of the error a handler raises (f-strings with ``DIST_NAME`` filled in), or None
    when it raises nothing (the feature turns itself off)."""
    for node in ast.walk(handler):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            arg = node.exc.args[0]
            if isinstance(arg, ast.Constant):
                return str(arg.value)
            if isinstance(arg, ast.JoinedStr):
                return "".join(
                    str(p.value)
                    if isinstance(p, ast.Constant)
                    else DIST_NAME
                    if ast.unparse(p.value).endswith("DIST_NAME")
                    else "{}"
                    for p in arg.values
                )
            return ""
    return None


def problems(found: list[_Import]) -> list[str]:
    bad = []
    guarded: dict[str, bool] = {}
    for imp in found:
        dists = distributions(imp.module)
        extras = {name for name, members in EXTRAS.items() if members & dists}
        if dists & DEPENDENCIES:
            continue
        if not imp.lazy:
            bad.append(f"{imp.where}: {imp.module} is imported at the top level but is not a dependency")
            continue
        if not extras:
            bad.append(f"{imp.where}: {imp.module} ({', '.join(sorted(dists))}) is declared nowhere")
            continue
        key = ",".join(sorted(dists))
        guarded.setdefault(key, False)
        if imp.guard is None:
            continue
        guarded[key] = True
        message = _message(imp.guard)
        if message is None:
            continue
        hints = {f"{DIST_NAME}[{e}]" for e in extras} | dists
        if not re.search(r"\bneeds?\b", message) or not any(f"pip install '{h}'" in message for h in hints):
            bad.append(f"{imp.where}: {message!r} does not say to install one of {sorted(hints)}")
    bad += [f"{key}: optional, but no import of it is guarded" for key, ok in guarded.items() if not ok]
    return bad


def package_imports() -> list[_Import]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += imports_of(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    return found


def test_every_third_party_import_of_the_package_is_declared():
    found = package_imports()
    assert problems(found) == []
    modules = {imp.module for imp in found}
    # the walk sees top-level and function-level imports alike (one that sees none passes nothing)
    assert {"numpy", "torch", "cv2", "yaml", "numcodecs", "google_crc32c", "pyarrow", "hdf5plugin"} <= modules


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import yaml\n", None),
        ("if TYPE_CHECKING:\n    import matplotlib\n", None),
        ("if TYPE_CHECKING:\n    pass\nelse:\n    import matplotlib\n", "not a dependency"),
        ("def f():\n    import numcodecs\n", None),
        ("import pyarrow\n", "imported at the top level but is not a dependency"),
        ("def f():\n    import pyarrow\n", "no import of it is guarded"),
        (
            "def f():\n    try:\n        import pyarrow\n    except ImportError:\n"
            "        raise UsageError(\"needs pyarrow: pip install 'cachekit[parquet]'\")\n",
            "does not say to install",
        ),
        (
            "def f():\n    try:\n        import pyarrow\n    except ImportError:\n"
            "        raise UsageError(f\"needs pyarrow: pip install '{DIST_NAME}[plot]'\")\n",
            "does not say to install",
        ),
        (
            "def f():\n    try:\n        import pyarrow\n    except ImportError:\n"
            "        raise UsageError(f\"needs pyarrow: pip install '{DIST_NAME}[parquet]'\")\n",
            None,
        ),
        ("def f():\n    try:\n        import pynvml\n    except Exception:\n        return None\n", None),
        (
            "def f():\n    try:\n        import pynvml\n    except KeyError:\n        pass\n",
            "no import of it is guarded",
        ),
    ],
)
def test_the_check_refuses_what_is_undeclared_or_unguarded(source, why):
    found = problems(imports_of(source, "m.py"))
    if why is None:
        assert found == []
    else:
        assert len(found) == 1 and why in found[0], found


def test_the_declared_lower_bounds_hold_here():
    """The versions installed here meet the bounds pyproject.toml declares for the new entries."""
    from packaging.version import Version

    for req in PROJECT["dependencies"]:
        name, _, bound = req.partition(">=")
        if _normal(name) in {"pyyaml", "numcodecs", "google-crc32c"}:
            assert Version(importlib.metadata.version(name)) >= Version(bound), req
