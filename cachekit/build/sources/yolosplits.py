"""Splits named by a YOLO ``data.yaml`` (the rule ``layouts.YOLO_SPLITS``; ``--annotations yolo`` finds
``RAW/data.yaml``): ``train:``, ``val:`` or ``test:``, each a folder, a list of folders or a ``.txt``
file of image paths, resolved against its ``path:`` as Ultralytics does (else the yaml's folder);
without those keys, ``RAW/images/`` whose folders are all split names. A single split of all the
images (``train: images``) is the dataset itself, built as one cache.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import UsageError
from .labelscsv import read_text_file
from .layouts import YOLO, Layout, Request
from .splitnames import Split, ordered, split_folders, warn_loose
from .yolo import load_data_yaml

__all__ = ["find_splits"]


def find_splits(request: Request, row: Layout) -> dict[str, Split] | None:
    """The splits a local YOLO tree's data.yaml (or its ``images/`` folders) names; None for a URL."""
    if not request.local_dir:
        return None
    return _yolo_splits(Path(request.text), str(request.annotations))


def _read_yaml(path: Path) -> dict:
    data = load_data_yaml(path)
    return data if isinstance(data, dict) else {}


def _dataset_root(yaml_path: Path, data: dict, raw: Path) -> Path:
    """data.yaml's ``path:``: absolute, or relative to the yaml's folder or the working folder (as
    Ultralytics tries it); the yaml's folder without one; RAW when it names a folder not here (a
    yaml copied with the dataset, its ``path:`` still the machine's it came from)."""
    given = data.get("path")
    if not given:
        return yaml_path.parent
    path = Path(str(given)).expanduser()
    tries = [path] if path.is_absolute() else [yaml_path.parent / path, Path.cwd() / path]
    return next((p for p in tries if p.is_dir()), raw)


def _yolo_splits(raw: Path, annotations: str) -> dict[str, Split] | None:
    yaml_path = Path(annotations) if annotations != YOLO.annotations else raw / "data.yaml"
    data = _read_yaml(yaml_path) if os.path.lexists(yaml_path) else {}
    keys = [k for k in ("train", "val", "test") if data.get(k)]
    yaml_arg = str(yaml_path) if os.path.lexists(yaml_path) else annotations
    if not keys:  # images/<split>/ folders
        found = split_folders(raw / "images")
        if found is None:
            return None
        warn_loose(raw / "images", list(found.values()))
        return ordered(
            {
                n: Split(n, str(raw / "images" / f), yaml_arg, origin=f"the folders of {raw}/images")
                for n, f in found.items()
            }
        )
    root = _dataset_root(yaml_path, data, raw)
    out = {}
    for key in keys:
        entries = data[key] if isinstance(data[key], list) else [data[key]]
        where = [root / str(e) if not Path(str(e)).is_absolute() else Path(str(e)) for e in entries]
        origin = f"{yaml_path.name}'s train/val/test"
        if len(where) == 1 and where[0].is_dir():
            out[key] = Split(key, str(where[0]), yaml_arg, origin=origin)
            continue
        only, missing = [], []
        for entry, path in zip(entries, where):
            if path.is_dir():
                listed = [path]
            elif path.is_file() and path.suffix.lower() == ".txt":
                listed = _listed_images(path)
            else:
                raise UsageError(f"{yaml_path}: {key}: {entry} is neither a folder nor a .txt file of images")
            for p in listed:
                rel = _relative(p, root)
                if rel is None:
                    missing.append((str(p), f"listed by {key} of {yaml_path.name} but not under {root}"))
                else:
                    only.append(rel)
        out[key] = Split(key, str(root), yaml_arg, tuple(only), tuple(missing), origin)
    if len(out) == 1:  # one split of every image (``train: images``): the dataset, built as one cache
        (single,) = out.values()
        whole = {os.path.abspath(p) for p in (raw, raw / "images", root, root / "images")}
        if single.only is None and os.path.abspath(single.raw) in whole:
            return None
    return ordered(out)


def _listed_images(txt: Path) -> list[Path]:
    """The image paths of an Ultralytics ``.txt`` list: one a line, relative ones (``./images/a.jpg``)
    to the list's folder."""
    text = read_text_file(txt, "an image list", 256 << 20, "a text file of image paths, one a line")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            p = Path(line)
            out.append(p if p.is_absolute() else txt.parent / p)
    return out


def _relative(path: Path, root: Path) -> str | None:
    """``path`` relative to ``root`` (POSIX), both made absolute without following links; None
    when it is not below it."""
    try:
        rel = Path(os.path.normpath(os.path.abspath(path))).relative_to(
            os.path.normpath(os.path.abspath(root))
        )
    except ValueError:
        return None
    return rel.as_posix()
