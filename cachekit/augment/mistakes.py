"""What a wrong item in an augment list is, in one line: a container of transforms, None, a
transform's name as text, another library's transform, a plain function.

Above the catalogue (a name given as text is answered with the transform of that name), below the
plan that asks.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator

from .catalogue import STEPS

__all__ = ["not_a_step", "is_compose"]


def is_compose(value) -> bool:
    """Whether ``value`` holds a list of transforms of its own (a ``Compose``: torchvision's,
    albumentations', a user's): no step, and no function of the epoch either."""
    return not isinstance(value, type) and isinstance(getattr(value, "transforms", None), (list, tuple))


def not_a_step(item) -> str | None:
    """The one line for what was given in an augment list where a transform belongs, when it is a
    container of them (a list in the list, a ``Compose``, a generator, a set), None, a transform's
    name as text, another library's transform, or a plain function; None for anything else (which
    the plan names with the transforms it takes)."""
    kind = type(item).__name__
    if isinstance(item, (list, tuple)):
        return f"augment: a {kind} inside the augment list: give one flat list, augment=[*first, *second]"
    if is_compose(item):
        return (
            f"augment: a {kind} is not run as it is: give its cachekit.transforms as one flat list, "
            "augment=[...] (a function of your own goes in PixelOp(fn), BatchOp(fn) or MatrixOp(fn))"
        )
    if isinstance(item, (Iterator, set, frozenset, dict)):
        return f"augment takes a list of transforms in the order they run, not a {kind}: write augment=[...]"
    if item is None:
        return "augment: None in the augment list: leave it out (augment=None for no augmentation)"
    if isinstance(item, str):
        named = {t.__name__.lower(): t.__name__ for t in STEPS}.get(item.lower())  # only one that exists
        return (
            f"augment: the text {item!r} in the augment list: give the transform itself, "
            f"cachekit.transforms.{named}(...)"
            if named is not None
            else f"augment: the text {item!r} in the augment list: give cachekit.transforms, e.g. augment=[Resize(224)]"
        )
    module = (type(item).__module__ or "").split(".")[0]
    if module in _OTHER_LIBRARIES:
        return (
            f"augment: {type(item).__name__} of {module} is not run here: give the cachekit.transforms of the "
            "same name (torchvision's meanings), or your own function in PixelOp(fn), BatchOp(fn) or MatrixOp(fn)"
        )
    if inspect.isroutine(item) or isinstance(item, functools.partial):
        name = getattr(item, "__qualname__", None) or getattr(getattr(item, "func", None), "__qualname__", "")
        return (
            f"augment: the function {name or type(item).__name__} in the augment list: wrap it as "
            "PixelOp(fn) (fn(image, rng) -> image, each sample), BatchOp(fn) (fn(images, generator) -> "
            "images, each batch) or MatrixOp(fn) (fn(height, width, rng) -> 3x3 map)"
        )
    return None


#: Libraries whose transforms a user may hand over as they are.
_OTHER_LIBRARIES = ("torchvision", "albumentations", "kornia", "ultralytics", "timm")
