"""Augmentation as text: ``"RandomResizedCrop(224),RandomHorizontalFlip()"`` parsed without evaluating it.

A spec is a comma-separated list of calls of transforms by name (a bare name is a call with no
arguments). The text is parsed into a syntax tree, never run: each call's name must be one of the
transforms ``make_loader`` takes (``CATALOGUE``, what ``cachekit.transforms`` exports) and each
argument a literal (numbers, strings, tuples, lists, ``True``/``False``/``None``) read with
``ast.literal_eval``; anything else (attributes, nested calls, operators, names) is refused in one
line. ``format_spec`` writes a list of transforms back in the same form (a loader's state keeps
the plan of its epoch that way).
"""

from __future__ import annotations

import ast
import dataclasses

from . import catalogue as _catalogue
from .plan import AugmentUsageError, check_order
from .userops import USER_OPS

__all__ = ["MAX_SPEC_CHARS", "catalogue", "parse_spec", "format_spec"]

#: The longest spec read (a recipe is a few hundred characters; a longer one is not a recipe).
MAX_SPEC_CHARS = 4000
#: The longest refusal written back (a transform's own message may quote a long argument whole).
MAX_MESSAGE_CHARS = 300


def catalogue() -> dict[str, type]:
    """Transforms by name: every class ``make_loader(augment=...)`` accepts."""
    return {cls.__name__: cls for cls in _catalogue.CATALOGUE}


def _literal(node: ast.AST, where: str):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        shown = ast.unparse(node) if len(ast.dump(node)) < 2000 else "(a long expression)"
        raise ValueError(
            f"augment spec: {where}: arguments must be literals (numbers, strings, tuples), got {shown[:60]!r}"
        ) from None


def _user_op(name: str, args: list, kwargs: dict, ops: dict | None):
    """The user's op a spec names by its function's qualified name (``PixelOp('module.fn')``), taken
    from ``ops`` (the ops the loader was given, by ``spec_text``): a function is never looked up."""
    if len(args) != 1 or not isinstance(args[0], str) or set(kwargs) - {"size"}:
        raise ValueError(f"augment spec: {name} is written {name}('module.function') in a loader's state")
    size = kwargs.get("size")
    if size is not None and not isinstance(size, (tuple, list)):
        raise ValueError(f"augment spec: {name}: size is (height, width) in a loader's state, got {size!r}")
    text = f"{name}({args[0]!r}{'' if size is None else f', size={tuple(size)!r}'})"
    if ops is None:  # text from a command line or a file: no function can be named there
        raise AugmentUsageError(
            f"augment spec: {name} wraps a Python function and cannot be given as text: pass "
            f"{name}(fn) in make_loader(augment=[...])"
        )
    op = ops.get(text)
    if op is None:
        raise AugmentUsageError(
            f"augment: {text} is the user's own op, and this loader was not given it: a loader resumed "
            "from a state is made with the same augment list"
        )
    return op


def parse_spec(text: str, known: dict[str, type] | None = None, ops: dict | None = None) -> list:
    """The transforms a spec names, constructed (and so checked) by their own classes.

    ``known``: the catalogue to look names up in (default: ``catalogue()``); ``ops``: the user's own
    ops a spec may name (``PixelOp('module.fn')``, as a loader's state writes them), by their
    ``spec_text``. An empty spec (or
    ``"none"``) is an empty list. Every refusal is a ``ValueError`` of one line (a list in an order
    the loader would not run as written: also a ``UsageError``, ``plan.check_order``).
    """
    if not isinstance(text, str):
        raise ValueError(f"augment spec must be text, got {type(text).__name__}")
    if len(text) > MAX_SPEC_CHARS:
        raise ValueError(f"augment spec is {len(text)} characters, over the {MAX_SPEC_CHARS} a recipe needs")
    if text.strip().lower() in ("", "none", "[]"):
        return []
    known = catalogue() if known is None else known
    try:
        tree = ast.parse(f"[{text}]", mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        why = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        raise ValueError(
            f"augment spec is not a list of transforms such as 'RandomResizedCrop(224),RandomHorizontalFlip()' "
            f"({why})"
        ) from None
    if not isinstance(tree.body, ast.List):
        raise ValueError("augment spec must be a comma-separated list of transforms")
    steps = []
    for node in tree.body.elts:
        call = node if isinstance(node, ast.Call) else None
        name_node = call.func if call is not None else node
        if not isinstance(name_node, ast.Name):
            shown = ast.unparse(node)[:60]
            raise ValueError(
                f"augment spec: {shown!r} is not a transform's name and arguments, such as Resize(256)"
            )
        name = name_node.id
        cls = known.get(name)
        user = {c.__name__: c for c in USER_OPS}.get(name)
        if cls is None and user is None:
            raise ValueError(f"augment spec: unknown transform {name!r} (known: {', '.join(sorted(known))})")
        args, kwargs = [], {}
        if call is not None:
            for arg in call.args:
                if isinstance(arg, ast.Starred):
                    raise ValueError(f"augment spec: {name}: *arguments are not taken")
                args.append(_literal(arg, name))
            for kw in call.keywords:
                if kw.arg is None:
                    raise ValueError(f"augment spec: {name}: **arguments are not taken")
                if kw.arg in kwargs:
                    raise ValueError(f"augment spec: {name}: {kw.arg}= is given twice")
                kwargs[kw.arg] = _literal(kw.value, f"{name} {kw.arg}")
        if user is not None:
            steps.append(_user_op(name, args, kwargs, ops))
            continue
        try:
            steps.append(cls(*args, **kwargs))
        except (TypeError, ValueError) as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            message = f"augment spec: {message if name in message else f'{name}: {message}'}"
            if len(message) > MAX_MESSAGE_CHARS:  # a value echoed back whole would bury the reason
                message = message[: MAX_MESSAGE_CHARS - 3] + "..."
            raise ValueError(message) from None
    try:  # an order the loader would not run as written: refused here, where the text is read
        check_order(steps)
    except AugmentUsageError as exc:
        raise AugmentUsageError(f"augment spec: {str(exc).removeprefix('augment: ')}") from None
    return steps


def _plain(value):
    """``value`` with numpy scalars as Python numbers (``np.int64(224)`` is written ``224``), so a
    transform given numpy arguments still writes back as literals."""
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    item = getattr(value, "item", None)
    return item() if type(value).__module__ == "numpy" and callable(item) and not value.shape else value


def format_spec(steps) -> str | None:
    """A spec that ``parse_spec`` reads back into equal transforms, or None when one cannot be
    written so (a transform that is not a dataclass of literal values)."""
    if steps is None:
        return ""
    parts, ops = [], {}
    for step in steps:
        if isinstance(step, USER_OPS):  # the user's op: by its function's name
            parts.append(step.spec_text())
            ops[parts[-1]] = step
            continue
        if not dataclasses.is_dataclass(step) or isinstance(step, type):
            return None
        values = ", ".join(
            f"{f.name}={_plain(getattr(step, f.name))!r}" for f in dataclasses.fields(step) if f.init
        )
        parts.append(f"{type(step).__name__}({values})")
    text = ", ".join(parts)
    try:
        same = parse_spec(text, ops=ops) == list(steps)
    except ValueError:
        return None
    return text if same else None
