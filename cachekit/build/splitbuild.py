"""One cache per split of a RAW that names splits, at ``OUT/<split>``: every split discovered, their class
names made one list in one order (so class ids agree), inputs found in two splits reported, each
split's folder within RAW recorded (``source.prefix``) so that ``ds.source(i)`` is relative to RAW as
for one cache, and the chosen splits built (``cacherun``).
"""

from __future__ import annotations

import os
import posixpath
import sys
import warnings
from dataclasses import replace
from pathlib import Path

from ..constants import MANIFEST_NAME
from ..errors import UsageError
from ..store.location import open_location
from ..store.remote import is_url
from ..store.sourcecol import PREFIX
from ..store.splitdirs import check_split_out
from .cacherun import build_cache
from .config import BuildConfig, SplitsResult
from .findsource import find_source
from .guards import check_apart, check_config
from .sources.classnames import read_names_file, with_class_order
from .sources.inputtable import Source
from .sources.layouts import SORTED, VOC, layout_named
from .sources.recordfiles import pattern_folder
from .sources.splitnames import Split
from .splits import pick_splits, split_out

__all__ = ["build_splits"]


def build_splits(raw, out, config: BuildConfig, splits: dict[str, Split]) -> SplitsResult:
    """One cache per split at ``out/<split>``: every split discovered (their class names made one
    list, in one order), inputs found in two splits reported, the chosen ones built."""
    chosen = pick_splits(splits, config.split, raw)
    check_config(config)
    if not is_url(os.fspath(raw)) and os.path.isdir(raw):
        check_apart(raw, out)  # not only apart from each split: a cache inside RAW would be read back
    location = open_location(out, config.storage_options)
    if location.exists() and location.read_text(MANIFEST_NAME) is not None:
        raise UsageError(
            f"{out} holds one cache of all of {raw}'s splits together; each split is now a cache of its "
            f"own at {out}/<split>: remove {out} or give another --out"
        )
    for name in chosen:  # never through a link: the readers would refuse what it was built into
        check_split_out(split_out(out, name))
    mask_names = read_names_file(config.mask_classes, "--mask-classes", 256) if config.mask_classes else None
    found = {}
    for name, split in splits.items():
        split_config = replace(
            config,
            annotations=split.annotations,
            masks=_split_folder(config.masks, name),
            arrays={k: _split_folder(v, name) for k, v in config.arrays.items()},
        )
        split_raw, source = find_source(
            split.raw, split_out(out, name), split_config, mask_classes=mask_names
        )
        if split.only is not None:
            source = _only(source, split)
        prefix = _split_prefix(raw, split_raw)
        if prefix:  # ds.source(i) puts it before each stored path: relative to RAW, as for one cache
            source = replace(source, extra={**source.extra, PREFIX: prefix})
        found[name] = (split_config, split_raw, source)
    names = _union_classes([s for _, _, s in found.values()])
    for name, (split_config, split_raw, source) in found.items():
        if tuple(source.classes) != names:
            found[name] = (
                split_config,
                split_raw,
                with_class_order(source, names, "the splits' class names"),
            )
    overlaps = _overlaps({n: s for n, (_, _, s) in found.items()}, raw)
    if overlaps:
        examples = ", ".join(overlaps[:3])
        warnings.warn(
            f"{len(overlaps)} inputs of {raw} are in more than one split, each built into every split "
            f"naming it: {examples}{' ...' if len(overlaps) > 3 else ''}",
            UserWarning,
            stacklevel=3,
        )
    results = {}
    for name in chosen:
        split_config, split_raw, source = found[name]
        if config.progress:
            print(f"split {name}: {len(source)} inputs -> {split_out(out, name)}", file=sys.stderr)
        results[name] = build_cache(split_raw, split_out(out, name), split_config, found=(split_raw, source))
    origin = next(iter(splits.values())).origin
    return SplitsResult(os.fspath(out), results, origin, len(overlaps))


def _split_prefix(raw, split_raw) -> str:
    """Where a split's inputs lie relative to ``raw``, the RAW the build was given (``images/train``,
    ``train``, ``data``; "" for the same folder): a split's source paths are relative to its own folder
    (a folder, or a pattern's), and ``ds.source(i)`` puts this before them."""
    here, there = _inputs_folder(raw), _inputs_folder(split_raw)
    if is_url(here):
        rel = posixpath.relpath(there.split("://", 1)[-1], here.split("://", 1)[-1])
    else:
        rel = os.path.relpath(os.path.abspath(there), os.path.abspath(here)).replace(os.sep, "/")
    return "" if rel == "." else rel


def _inputs_folder(raw) -> str:
    """The folder a source's paths are relative to: ``raw`` itself, or a pattern's folder."""
    text = os.fspath(raw)
    if not is_url(text) and os.path.isdir(text):
        return text
    return pattern_folder(text) or ("." if not is_url(text) else text)


def _split_folder(folder, name: str):
    """``folder/<split>`` when ``folder`` (a local folder of masks or arrays) has one, else ``folder``."""
    if folder is None or is_url(os.fspath(folder)):
        return folder
    sub = Path(folder) / name
    return str(sub) if sub.is_dir() else folder


def _only(source: Source, split: Split) -> Source:
    """The inputs of ``source`` a data.yaml lists for ``split`` (files, or folders of them); listed
    files it does not hold are reported as left out."""
    root = Path(split.raw)
    files = {p for p in split.only if not (root / p).is_dir()}
    folders = tuple(f"{p.rstrip('/')}/" for p in split.only if p not in files)
    keep = [i for i, p in enumerate(source.paths) if p in files or p.startswith(folders)]
    held = set(source.paths)
    held_by = (
        f"{root}/images"
        if split.annotations != VOC.annotations
        else f"{root}/JPEGImages with an Annotations/ file"
    )
    missing = [(p, f"listed by {split.origin} but not an image of {held_by}") for p in files - held]
    return source.subset(keep, [*split.missing, *sorted(missing)])


def _class_rule(source: Source) -> str | None:
    """How ``source``'s layout names its classes (``layouts``' SORTED, NUMBERED or LISTED)."""
    row = layout_named(source.layout)
    return row.class_names if row is not None else None


def _union_classes(sources: list[Source]) -> tuple[str, ...]:
    """One class list for every split: an ImageFolder's sorted folder names, numbered classes up to
    the largest any split uses, else the names in order of appearance (a data.yaml's, the files')."""
    names: list[str] = []
    for source in sources:
        names += [c for c in source.classes if c not in names]
    if all(_class_rule(s) == SORTED or not s.classes for s in sources):
        return tuple(sorted(names))
    return tuple(names)


def _overlaps(sources: dict[str, Source], raw) -> list[str]:
    """Inputs that are the same file in more than one split (the same device and inode: one path
    twice, a symbolic or a hard link), each as its paths (relative to ``raw``) and splits, sorted:
    ``images/a.jpg (train and test)``, ``train/a.jpg (train) = val/b.jpg (val)``."""
    where: dict[object, list[tuple[str, str]]] = {}
    for name, source in sources.items():
        if source.reader is not None or is_url(os.fspath(source.root)):
            continue  # files of records: each file is one split's by construction
        for rel in source.paths:
            path = os.path.join(source.root, rel)
            try:
                st = os.stat(path)
                key: object = (st.st_dev, st.st_ino)
            except OSError:
                key = os.path.realpath(path)
            where.setdefault(key, []).append((os.path.relpath(path, raw), name))
    out = []
    for found in where.values():
        if len({name for _, name in found}) < 2:
            continue
        paths = {p: [n for q, n in found if q == p] for p, _ in found}
        out.append(" = ".join(f"{p} ({' and '.join(names)})" for p, names in paths.items()))
    return sorted(out)
