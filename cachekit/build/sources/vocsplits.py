"""Splits named by a VOC tree's ``ImageSets/Main/{train,val,trainval,test}.txt`` (the rule
``layouts.VOC_SPLITS``, ``--annotations voc``): lists of image ids, ``trainval`` left out when
``train`` and ``val`` are there.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .labelscsv import read_text_file
from .layouts import VOC, Layout, Request
from .splitnames import Split, ordered

__all__ = ["find_splits", "VOC_LISTS"]


def find_splits(request: Request, row: Layout) -> dict[str, Split] | None:
    """The splits a local VOC tree's image sets name; None for a URL or a tree without them."""
    if not request.local_dir:
        return None
    return _voc_splits(Path(request.text))


#: VOC's lists of image ids that name splits, in ``ImageSets/Main/`` (``trainval`` is train + val).
VOC_LISTS = ("train", "val", "trainval", "test")


def _voc_splits(raw: Path) -> dict[str, Split] | None:
    """A VOC tree's ``ImageSets/Main/{train,val,trainval,test}.txt``: each a split of the images
    whose ids it lists (``JPEGImages/<id>.jpg``); ``trainval`` is left out, and said so, when
    ``train`` and ``val`` are there (it is their union). None when there are no such lists."""
    folder = raw / "ImageSets" / "Main"
    lists = {n: folder / f"{n}.txt" for n in VOC_LISTS if (folder / f"{n}.txt").is_file()}
    if not lists:
        return None
    if "trainval" in lists and "train" in lists and "val" in lists:
        del lists["trainval"]
        warnings.warn(
            f"{folder}/trainval.txt is train.txt and val.txt together: not built as a split of its "
            "own (its images are in the train and val caches)",
            UserWarning,
            stacklevel=2,
        )
    try:
        names = sorted(e.name for e in os.scandir(raw / "JPEGImages") if e.is_file())
    except OSError:
        names = []
    image_of: dict[str, str] = {}
    for name in names:
        image_of.setdefault(os.path.splitext(name)[0], f"JPEGImages/{name}")
    out = {}
    for name, txt in lists.items():
        text = read_text_file(txt, "an image set", 256 << 20, "a text file of image ids, one a line")
        ids = [line.split()[0] for line in text.splitlines() if line.strip()]
        only = [image_of[i] for i in ids if i in image_of]
        missing = tuple(
            (f"ImageSets/Main/{name}.txt: {i}", f"no image JPEGImages/{i}.* in {raw}")
            for i in ids
            if i not in image_of
        )
        out[name] = Split(name, str(raw), VOC.annotations, tuple(only), missing,
                          origin=f"{raw}/ImageSets/Main's lists")  # fmt: skip
    return ordered(out)
