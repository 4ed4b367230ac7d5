"""How a user's op is named, and whether it can reach a loader's worker processes.

A loader's state records each user op by name (``op_name``), and a resumed loader must be given the
same list: so the name says the function and the arguments or fields it was given, the same in
every process (no address, sets sorted). Worker processes receive the ops pickled: one that does
not pickle, or that names a ``__main__`` a freshly started worker never runs (a notebook's, a
package's ``__main__.py``), is refused in one line when the loader is made (``worker_refusal``).
"""

from __future__ import annotations

import functools
import os
import pickle
import pickletools
import sys
import threading
import types

__all__ = ["op_name", "said_in_one_line", "worker_refusal", "unreachable_main"]


#: The longest argument or field written into an op's name (a longer one is left out of it).
MAX_SHOWN = 120


def _shown(value) -> str | None:
    """``value`` as an op's name shows it: a function by its name, else its repr where that is one
    short line the same in every process (no address); None otherwise."""
    if isinstance(value, functools.partial) or (callable(value) and hasattr(value, "__qualname__")):
        return op_name(value)
    try:
        text = _text(value)
    except Exception:  # noqa: BLE001 -- a value that cannot show itself is left out of the name
        return None
    return None if " at 0x" in text or "\n" in text or len(text) > MAX_SHOWN else text


def _text(value) -> str:
    """``repr(value)``, the members of a set (also one in a list, tuple or dict) in sorted order: a
    set's own order changes with each process's hash seed, and a resumed loader's names must match."""
    kind = type(value)
    if kind in (set, frozenset):
        try:
            members = ", ".join(_text(v) for v in sorted(value))
        except TypeError:  # members that do not compare: by their text
            members = ", ".join(sorted(_text(v) for v in value))
        inner = "{" + members + "}" if members else ""
        return inner if kind is set and members else f"{kind.__name__}({inner})"
    if kind in (list, tuple):
        items = [_text(v) for v in value]
        return f"[{', '.join(items)}]" if kind is list else f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if kind is dict:
        return "{" + ", ".join(f"{_text(k)}: {_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


def op_name(fn) -> str:
    """``fn``'s qualified name, as a loader's state records it: ``module.qualname``; a
    ``functools.partial`` with its arguments, an instance of a callable class with its fields
    (``module.Class(value=10)``), so that two ops of one function given other arguments differ."""
    if isinstance(fn, functools.partial):
        given = [_shown(a) for a in fn.args] + [f"{k}={_shown(v) or '...'}" for k, v in fn.keywords.items()]
        return f"{op_name(fn.func)}({', '.join(g or '...' for g in given)})"
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, types.MethodType) and not isinstance(owner, type):  # an object's method: with its fields
        return f"{_instance_name(owner)}.{fn.__name__}"
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None)
    if qualname is not None:
        return f"{module}.{qualname}"
    return _instance_name(fn)  # an instance of a callable class


def _instance_name(obj) -> str:
    """An object as an op's name shows it: ``module.Class(field=value, ...)``, by its own repr where
    that is one (a dataclass's), else by its public fields."""
    module, qualname = type(obj).__module__, type(obj).__qualname__
    if type(obj).__repr__ is not object.__repr__:
        text = _shown(obj)
        return f"{module}.{text}" if text is not None and text.startswith(type(obj).__name__) else f"{module}.{qualname}"
    busy = _naming.__dict__.setdefault("objects", set())
    if id(obj) in busy:  # a field refers back to it (self.impl = self.fast): by its class alone there
        return f"{module}.{qualname}"
    busy.add(id(obj))
    try:
        fields = [f"{k}={_shown(v) or '...'}" for k, v in _fields(obj) if not k.startswith("_")]
    finally:
        busy.discard(id(obj))
    return f"{module}.{qualname}({', '.join(fields)})"


_naming = threading.local()  # the objects being named, in this thread


def _fields(obj) -> list:
    """An object's fields, ``(name, value)``: its ``__slots__`` (its classes', base first), then its
    ``__dict__``."""
    slots = []
    for cls in reversed(type(obj).__mro__):
        names = cls.__dict__.get("__slots__", ())
        for name in [names] if isinstance(names, str) else names:
            if name not in ("__dict__", "__weakref__") and name not in slots and hasattr(obj, name):
                slots.append(name)
    return [(name, getattr(obj, name)) for name in slots] + list(getattr(obj, "__dict__", {}).items())


def said_in_one_line(exc: BaseException) -> str:
    """An exception in one line: its type and its first non-blank line (its type alone where it has
    none, or cannot say itself)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 -- an exception that cannot say itself is still named
        text = ""
    message = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return (f"{type(exc).__name__}: {message}" if message else type(exc).__name__)[:200]


def _main_unreachable() -> str | None:
    """Where this process's ``__main__`` comes from, when a worker process started afresh
    (forkserver, spawn) never runs it again; None where it does, as ``multiprocessing`` runs a
    script or a module given to ``python -m`` again: not a notebook, ``python -c`` or an interactive
    prompt, nor a package's or a zip's ``__main__.py`` (``python -m package``), which it never runs
    in a worker either, so their functions are never defined there."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name:
        if name == "__main__" or name.endswith(".__main__"):
            return "a package's __main__.py (python -m package)"
        return None
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and os.path.isfile(path):
        return None
    return "an interactive session (a notebook, python -c)"


def worker_refusal(op, fresh: bool = True) -> str | None:
    """Why the user's ``op`` cannot reach a loader's worker processes, in one line, or None.

    It must pickle (not a lambda, nor a function defined inside another); and where the workers
    start afresh (``fresh``: a forkserver or spawn, not a fork) whatever it names must be importable
    there: a function of a notebook's, ``python -c``'s or a package's ``__main__`` pickles by name,
    and each worker would die unpickling it."""
    try:
        pickle.dumps(op)
    except Exception as exc:  # noqa: BLE001 -- whatever pickling raises is said in one line
        if "<lambda>" in op.name or "<locals>" in op.name:
            return (
                f"augment: {op!r} cannot be sent to the loader's worker processes (its function is a lambda or "
                "defined inside another function): define it at the top level of a module, or pass workers=0"
            )
        why = said_in_one_line(exc)
        return (
            f"augment: {op!r} cannot be sent to the loader's worker processes: it does not pickle ({why}): "
            "give it only what pickles, or pass workers=0"
        )
    where = unreachable_main(op) if fresh else None
    if where is not None:
        return (
            f"augment: {op!r} cannot be sent to the loader's worker processes: it is defined in {where}, "
            "which they do not run: define it in a module file and import it, or pass workers=0"
        )
    return None


def unreachable_main(obj) -> str | None:
    """Where the ``__main__`` that ``obj`` (which pickles) refers to by name comes from, when worker
    processes started afresh never run it (``_main_unreachable``); None when it refers to none, or
    they do."""
    where = _main_unreachable()
    if where is None:
        return None
    try:  # protocol 2 names every global it refers to as "module name"
        names = [arg for code, arg, _ in pickletools.genops(pickle.dumps(obj, protocol=2)) if code.name == "GLOBAL"]
    except Exception:  # noqa: BLE001 -- it pickles otherwise: nothing more to say of it
        return None
    return where if any(str(name).split(" ")[0] == "__main__" for name in names) else None
