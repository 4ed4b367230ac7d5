"""A dataset's splits, found before its inputs: a RAW that names splits builds one cache per split.

What names splits:

- a YOLO ``data.yaml`` (``--annotations yolo`` finds ``RAW/data.yaml``) with ``train:``, ``val:``
  or ``test:``: each a folder, a list of folders or a ``.txt`` file of image paths, resolved against
  its ``path:`` as Ultralytics does (else the yaml's folder); without those keys, ``RAW/images/``
  whose folders are all split names. A single split of all the images (``train: images``) is the
  dataset itself, built as one cache;
- Parquet or tar files (a pattern, or a folder holding them directly or in ``data/``) whose names
  or folders start with a split name, Hugging Face's ``data/train-00000-of-00002.parquet``,
  ``data/test-*.parquet``, ``train/*.parquet`` or WebDataset's ``train-000000.tar``;
- a VOC tree's ``ImageSets/Main/{train,val,trainval,test}.txt`` (``--annotations voc``): lists of
  image ids, ``trainval`` left out when ``train`` and ``val`` are there;
- a folder whose folders are all split names (``train/``, ``val/``, in any case: ``Train/`` is
  ``train``): an ImageFolder tree each, or a folder of Parquet or tar files each.

A pattern that names one split only (``data/train-*.parquet``) is that split's files: it builds
one cache, as any pattern does. Nothing else names splits (a labels CSV or a COCO file says which
files are inputs).
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..constants import IMAGE_EXTENSIONS
from ..errors import UsageError
from ..store.remote import is_url
from .sources.layouts import (
    FILE_SPLITS,
    FOLDER_SPLITS,
    VOC,
    VOC_SPLITS,
    YOLO,
    YOLO_SPLITS,
    Request,
    detect,
    record_suffixes,
)

__all__ = ["SPLIT_NAMES", "Split", "find_splits", "pick_splits", "split_of_name", "split_out"]

#: Folder and file names that name a split (Ultralytics', Hugging Face's, torchvision's).
SPLIT_NAMES = ("train", "val", "valid", "validation", "test")
_NAME_HEAD = re.compile(r"^([A-Za-z]+)(?:[-_.].*)?$")
_PATTERN_CHARS = set("*?[]{},")
#: Loose images named in the warning about them (the count names them all).
_SHOWN = 3


@dataclass(frozen=True)
class Split:
    """One split of a RAW: what to build it from.

    ``raw``: a folder, or a pattern of Parquet or tar files naming exactly this split's files.
    ``annotations``: YOLO's data.yaml (its class names for every split). ``only``: paths under
    ``raw`` (files or folders, relative to it) that are this split's inputs, when a data.yaml lists
    them; ``missing``: ``(entry, reason)`` for listed images that are not under ``raw``.
    """

    name: str
    raw: str
    annotations: str | None = None
    only: tuple[str, ...] | None = None
    missing: tuple[tuple[str, str], ...] = ()
    origin: str = ""  # what named it (data.yaml, file names, folders), for messages


def split_out(out, name: str) -> str:
    """Where split ``name`` of a build into ``out`` goes: ``out/name`` (a folder or a URL)."""
    text = os.fspath(out)
    return f"{text.rstrip('/')}/{name}" if is_url(text) else os.path.join(text, name)


def split_of_name(name: str) -> str | None:
    """The split a file of records belongs to by its relative name: a folder named as a split
    (``train/0001.parquet``, the innermost), else a file name starting with one and ``-``, ``_`` or
    ``.`` (``train-00000-of-00002.parquet``, ``test.parquet``); None when neither."""
    parts = PurePosixPath(name).parts
    for part in reversed(parts[:-1]):
        if part.lower() in SPLIT_NAMES:
            return part.lower()
    m = _NAME_HEAD.match(parts[-1]) if parts else None
    if m and m.group(1).lower() in SPLIT_NAMES:
        return m.group(1).lower()
    return None


def pick_splits(found: dict[str, Split], wanted, raw) -> dict[str, Split]:
    """The splits ``wanted`` names (``"train,val"`` or a list; None: all), in ``found``'s order; a
    name not found is one line listing those that are."""
    if wanted is None:
        return dict(found)
    if not isinstance(wanted, (str, list, tuple)) or not all(isinstance(n, str) for n in wanted):
        raise UsageError(f"split={wanted!r}: give split names, 'train,val' or ['train', 'val']")
    names = [n.strip() for n in (wanted.split(",") if isinstance(wanted, str) else wanted)]
    names = [n for n in names if n]
    if not names:
        raise UsageError("--split names no split (give NAME[,NAME...])")
    unknown = [n for n in names if n not in found]
    if unknown:
        raise UsageError(
            f"--split {','.join(unknown)}: {raw} holds the splits {', '.join(found)} "
            f"(named by {next(iter(found.values())).origin})"
        )
    return {n: s for n, s in found.items() if n in names}


def find_splits(raw, annotations=None, labels=None, storage_options=None) -> dict[str, Split] | None:
    """The splits ``raw`` names, by name in the order found (``train`` first), or None when it names
    none. ``annotations`` and ``labels`` are the build's ``--annotations`` and ``--labels``."""
    if not isinstance(raw, (str, os.PathLike)):
        return None
    text = os.fspath(raw)
    if labels is not None:
        return None
    local_dir = not is_url(text) and os.path.isdir(text)
    row = detect(Request(raw, annotations=annotations))
    rule = row.splits if row is not None else None
    if not local_dir:
        if annotations is None and rule == FILE_SPLITS:
            return _record_splits(text, storage_options, need=2)
        return None
    if rule == YOLO_SPLITS:
        return _yolo_splits(Path(text), str(annotations))
    if rule == VOC_SPLITS:
        return _voc_splits(Path(text))
    if rule != FOLDER_SPLITS:
        return None  # a COCO file says which images are inputs; a kind that names no split
    root = Path(text)
    for folder in (root, root / "data"):
        for suffix in record_suffixes():
            if folder.is_dir() and any(
                e.is_file() and e.name.lower().endswith(suffix) for e in os.scandir(folder)
            ):
                return _record_splits(str(folder / f"*{suffix}"), storage_options, need=1)
    return _folder_splits(root)


def _ordered(splits: dict[str, Split]) -> dict[str, Split] | None:
    if not splits:
        return None
    rank = {n: i for i, n in enumerate(SPLIT_NAMES)}
    return {n: splits[n] for n in sorted(splits, key=lambda n: rank.get(n, len(rank)))}


def _subfolders(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def _split_folders(root: Path) -> dict[str, str] | None:
    """The folders of ``root`` by the split each names, in any case as Parquet names are (``Train/``
    is ``train``), when every one names one; None otherwise. Two naming one split are one line."""
    names = _subfolders(root)
    if not names or any(n.lower() not in SPLIT_NAMES for n in names):
        return None
    out: dict[str, str] = {}
    for name in names:
        if name.lower() in out:
            raise UsageError(
                f"{root}: the folders {out[name.lower()]} and {name} both name the split {name.lower()}: "
                "rename or remove one"
            )
        out[name.lower()] = name
    return out


def _folder_splits(root: Path) -> dict[str, Split] | None:
    """``root/<split>/`` folders, when every folder of ``root`` is named as a split."""
    found = _split_folders(root)
    if found is None:
        return None
    out = {}
    for name, folder_name in found.items():
        folder = root / folder_name
        raw = str(folder)
        for suffix in record_suffixes():
            if any(e.is_file() and e.name.lower().endswith(suffix) for e in os.scandir(folder)):
                raw = str(folder / f"*{suffix}")
                break
        out[name] = Split(name, raw, origin=f"the folders of {root}")
    _warn_loose(root, list(found.values()))
    return _ordered(out)


def _warn_loose(root: Path, splits: list[str]) -> None:
    """One warning naming the images directly in ``root`` beside its split folders: they are in no
    split, so no split's cache holds them (never dropped silently)."""
    try:
        loose = sorted(
            e.name
            for e in os.scandir(root)
            if not e.name.startswith(".") and e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS)
        )
    except OSError:
        return
    if loose:
        shown = ", ".join(loose[:_SHOWN])
        warnings.warn(
            f"{len(loose)} images directly in {root} are in no split (its folders {', '.join(splits)} are "
            f"the splits) and are left out: {shown}{' ...' if len(loose) > _SHOWN else ''}",
            UserWarning,
            stacklevel=2,
        )


def _record_splits(pattern: str, storage_options, need: int) -> dict[str, Split] | None:
    """The files ``pattern`` names grouped by ``split_of_name``; None when fewer than ``need``
    splits are named. Files of no split beside files of splits are one line (they would go nowhere)."""
    from .sources.recordfiles import _base, find_files

    kind = detect(Request(pattern)).files_noun
    files = find_files(pattern, storage_options, kind)
    groups: dict[str, list] = {}
    for f in files:
        groups.setdefault(split_of_name(f.name) or "", []).append(f)
    named = {k: v for k, v in groups.items() if k}
    if len(named) < need:
        return None
    if "" in groups:
        stray = groups[""]
        raise UsageError(
            f"{pattern}: files of the splits {', '.join(sorted(named))} and {len(stray)} of no split "
            f"(e.g. {stray[0].name}); name each split's files in the file or folder name"
        )
    base = _base(pattern)
    out = {}
    for name, group in named.items():
        out[name] = Split(name, _pattern_of(base, [f.name for f in group], name, pattern, storage_options),
                          origin=f"the file names of {pattern}")  # fmt: skip
    return _ordered(out)


def _pattern_of(base: str, names: list[str], split: str, pattern: str, storage_options) -> str:
    """A pattern naming exactly ``names`` (relative to ``base``), kept relative to the same folder:
    ``base/train-*.parquet`` when that glob finds them all and no other, else a brace list
    (``base/{x/train-0,y/train-1}.parquet``)."""
    from .sources.recordfiles import find_files

    join = (lambda rel: f"{base}/{rel}") if base else (lambda rel: rel)
    if len(names) == 1 and not _PATTERN_CHARS & set(names[0]):
        return join(names[0])
    suffix = PurePosixPath(names[0]).suffix
    folders = {str(PurePosixPath(n).parent) for n in names}
    if len(folders) == 1:
        folder = folders.pop()
        prefix = "" if folder == "." else f"{folder}/"
        for candidate in (f"{prefix}{split}-*{suffix}", f"{prefix}{split}_*{suffix}", f"{prefix}*{suffix}"):
            if candidate.endswith(f"/*{suffix}") and PurePosixPath(folder).name.lower() != split:
                continue
            try:
                # the candidate's names are relative to its own folder (base/prefix), ``names`` to base
                got = {f"{prefix}{f.name}" for f in find_files(join(candidate), storage_options, "")}
            except UsageError:
                continue
            if got == set(names):
                return join(candidate)
    if any(_PATTERN_CHARS & set(n) for n in names):
        raise UsageError(
            f"{pattern}: the files of split {split} cannot be named apart (a name holds one of "
            f"{''.join(sorted(_PATTERN_CHARS))}); give each split's files as their own pattern"
        )
    stems = [n[: len(n) - len(suffix)] for n in names]  # the suffix after the braces says the kind
    return join("{" + ",".join(stems) + "}" + suffix)


def _read_yaml(path: Path) -> dict:
    from .sources.yolo import load_data_yaml

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
        found = _split_folders(raw / "images")
        if found is None:
            return None
        _warn_loose(raw / "images", list(found.values()))
        return _ordered(
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
    return _ordered(out)


#: VOC's lists of image ids that name splits, in ``ImageSets/Main/`` (``trainval`` is train + val).
VOC_LISTS = ("train", "val", "trainval", "test")


def _voc_splits(raw: Path) -> dict[str, Split] | None:
    """A VOC tree's ``ImageSets/Main/{train,val,trainval,test}.txt``: each a split of the images
    whose ids it lists (``JPEGImages/<id>.jpg``); ``trainval`` is left out, and said so, when
    ``train`` and ``val`` are there (it is their union). None when there are no such lists."""
    from .sources.labelscsv import read_text_file

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
    return _ordered(out)


def _listed_images(txt: Path) -> list[Path]:
    """The image paths of an Ultralytics ``.txt`` list: one a line, relative ones (``./images/a.jpg``)
    to the list's folder."""
    from .sources.labelscsv import read_text_file

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
