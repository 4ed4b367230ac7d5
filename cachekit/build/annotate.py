"""A build's sources of targets beside the images: COCO or YOLO boxes, a folder of masks.

``coco_source`` and ``yolo_source`` make the whole ``Source`` (their files are the inputs);
``add_masks`` gives any source a ``mask`` field. Each input's raw target (its boxes in its own
pixels, or YOLO's normalised rows, its mask file) travels with it to the shard job
(``sampletargets``), where the image's decoded size is known; they are part of the inputs'
digest, so a changed annotation or mask rebuilds its shard. Files are reached through a ``Tree``:
a local folder (``os.stat``) or one listing of a URL.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..store.fields import ARRAY_DTYPES, FieldSpec
from ..store.remote import access_error, filesystem, is_url
from .coco import read_coco
from .inputs import read_input
from .sources import Source, Walk, file_problem, is_image_name, path_key, stat_problem, table, walk
from .yolo import LABEL_FILE_MAX_BYTES, label_path, parse_label_file, read_names

__all__ = ["Tree", "open_tree", "coco_source", "yolo_source", "add_masks", "add_arrays", "MASK_EXTENSION"]

MASK_EXTENSION = ".png"


class Tree:
    """The files under a root folder or URL: their (size, mtime_ns), the images below a folder, bytes."""

    def __init__(self, root: str | Path, storage_options: dict | None = None) -> None:
        self.root = root
        self.url = is_url(root)
        self._files: dict[str, tuple[int, int]] | None = None
        self._fs = self._base = None
        if self.url:
            from .sources import remote_files

            self._fs, self._base = filesystem(str(root), storage_options)
            self._files = remote_files(str(root), storage_options)

    def stat(self, rel: str) -> tuple[int, int] | str:
        """``(size, mtime_ns)`` of a regular file, or the reason it cannot be an input."""
        if self._files is not None:
            return self._files.get(rel, "unreadable: not found")
        path = Path(self.root) / rel
        try:
            st = path.stat()
        except OSError as exc:
            return "not found" if not os.path.lexists(path) else stat_problem(exc)
        return file_problem(st) or (st.st_size, st.st_mtime_ns)

    def images(self, top: str) -> tuple[list[tuple[str, int, int]], list[tuple[str, str]], dict]:
        """``(rel, size, mtime)`` of the images below ``top``, what was left out, and unread counts."""
        if self._files is not None:
            prefix = f"{top}/"
            rows = [(r, *v) for r, v in self._files.items() if r.startswith(prefix) and is_image_name(r)]
            return sorted(rows, key=lambda r: path_key(r[0])), [], {}
        found = Walk()
        walk(Path(self.root), top, found)
        return sorted(found.files, key=lambda r: path_key(r[0])), found.ignored, dict(found.unread)

    def read_many(self, rels: Iterable[str], max_bytes: int) -> dict[str, bytes | str]:
        """Each file's bytes, or why it could not be read (a reason string)."""
        rels = list(rels)
        if self._fs is None:
            out: dict[str, bytes | str] = {}
            for rel in rels:
                try:
                    out[rel] = read_input(Path(self.root) / rel, max_bytes)
                except Exception as exc:  # DecodeError (too big, not a file) or OSError
                    out[rel] = f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
            return out
        paths = {f"{self._base}/{rel}": rel for rel in rels}
        try:
            got = self._fs.cat(list(paths), on_error="return") if paths else {}
        except Exception as exc:
            raise access_error(str(self.root), exc, UsageError, "read") from None
        return {
            paths[p]: (v if isinstance(v, bytes) else f"cannot be read ({type(v).__name__}: {v})")
            for p, v in got.items()
        }


def open_tree(root: str | os.PathLike, storage_options: dict | None = None) -> Tree:
    if not is_url(root) and not Path(root).is_dir():
        raise UsageError(f"{root} is not a folder")
    return Tree(str(root) if is_url(root) else Path(root), storage_options)


def coco_source(root: str | Path, annotations: str | Path, storage_options: dict | None = None) -> Source:
    """The images a COCO file lists (those that exist in RAW), each with its boxes."""
    coco = read_coco(annotations)
    tree = open_tree(root, storage_options)
    rows, ignored, targets = [], [], {}
    for rel in sorted(coco.images, key=path_key):
        found = tree.stat(rel)
        if isinstance(found, str):
            ignored.append((rel, found))
            continue
        rows.append((rel, -1, *found))
        entry = coco.images[rel]
        targets[rel] = {"size": entry["size"], "boxes": entry["boxes"], "classes": entry["classes"],
                        "iscrowd": entry["iscrowd"]}  # fmt: skip
    source = table(root, "coco", rows, coco.classes, ignored, {})
    return source.with_targets(
        {"boxes": FieldSpec("boxes")},
        [targets[p] for p in source.paths],
        coco.dropped,
        {"category_ids": coco.category_ids, "annotations": Path(annotations).name},
    )


def yolo_source(root: str | Path, annotations: str, storage_options: dict | None = None) -> Source:
    """The images under ``RAW/images/``, each with the boxes of its ``RAW/labels/`` file."""
    tree = open_tree(root, storage_options)
    if not tree.url and not (Path(root) / "images").is_dir():
        raise UsageError(
            f"--annotations yolo expects the Ultralytics layout: {root}/images/ with the images and "
            f"{root}/labels/ with a .txt file per image"
        )
    yaml_path = Path(annotations) if annotations != "yolo" else None
    if yaml_path is None and not tree.url and (Path(root) / "data.yaml").is_file():
        yaml_path = Path(root) / "data.yaml"
    names = read_names(yaml_path) if yaml_path is not None else None
    images, ignored, unread = tree.images("images")
    labels = {rel: label_path(rel) for rel, *_ in images}
    present = {lab: s for lab in labels.values() if lab and not isinstance(s := tree.stat(lab), str)}
    texts = tree.read_many(present, LABEL_FILE_MAX_BYTES)
    targets, dropped, seen = [], [], 0
    for rel, *_ in images:
        lab = labels[rel]
        data = texts.get(lab) if lab else None
        if isinstance(data, str):
            dropped.append((lab, data))
            data = None
        rows, bad = parse_label_file(data, lab, len(names) if names else None) if data else ([], [])
        dropped += bad
        seen = max([seen, *(int(r[0]) + 1 for r in rows)])
        targets.append({"yolo": rows, "label_file": list(present.get(lab, (0, 0)))})
    if not images:
        raise UsageError(f"{root}/images holds no images")
    classes = names if names is not None else [str(i) for i in range(seen)]
    source = table(
        root, "yolo", [(rel, -1, size, mtime) for rel, size, mtime in images], classes, ignored, unread
    )
    return source.with_targets({"boxes": FieldSpec("boxes")}, targets, dropped, {"annotations": "yolo"})


def add_masks(source: Source, masks: str | os.PathLike, storage_options: dict | None = None) -> Source:
    """``source`` with a ``mask`` field: for each input ``a/b.jpg`` the class map ``MASKS/a/b.png``.

    An input without its mask cannot be trained on: it is left out and reported, with the path looked for.
    """
    tree = open_tree(masks, storage_options)
    keep, found, ignored = [], [], []
    for i, rel in enumerate(source.paths):
        mask_rel = f"{rel.rsplit('.', 1)[0]}{MASK_EXTENSION}"
        st = tree.stat(mask_rel)
        if isinstance(st, str):
            ignored.append((rel, f"no mask at {masks}/{mask_rel} ({st})"))
            continue
        keep.append(i)
        found.append([mask_rel, *st])
    if not keep:
        raise UsageError(
            f"{masks} holds no mask for any input (looked for {MASK_EXTENSION} files named as the images)"
        )
    out = source.subset(keep, ignored)
    targets = [dict(t or {}) | {"mask": m} for t, m in zip(out.targets or [None] * len(out), found)]
    extra = dict(out.extra) | {"masks": str(masks) if is_url(masks) else str(Path(masks).resolve())}
    return out.with_targets(out.fields | {"mask": FieldSpec("mask")}, targets, out.dropped, extra)


#: Largest ``.npy`` file a build reads as one sample's array.
ARRAY_FILE_MAX_BYTES = 64 << 20


def _npy_header(data: bytes) -> tuple[np.dtype, tuple[int, ...]] | str:
    """The dtype and shape a ``.npy`` file declares (nothing pickled is read), or why it cannot be used."""
    import io

    fh = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fh)
        read = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(fh)
    except (ValueError, OSError, SyntaxError) as exc:
        return f"not a .npy file ({' '.join(str(exc).split())[:100]})"
    if dtype.hasobject:
        return "a .npy file of Python objects (only numbers are read)"
    le = dtype.newbyteorder("<") if dtype.byteorder not in ("=", "|", "<") or dtype.itemsize > 1 else dtype
    if le.str not in ARRAY_DTYPES:
        return f"dtype {dtype.str} (an array field takes {', '.join(ARRAY_DTYPES)})"
    return le, tuple(int(v) for v in shape)


def add_arrays(
    source: Source, name: str, folder: str | os.PathLike, storage_options: dict | None = None
) -> Source:
    """``source`` with an ``array`` field ``name``: for each input ``a/b.jpg`` the array ``FOLDER/a/b.npy``.

    Its dtype is the files' (all alike); its shape theirs, with ``null`` where they differ. An input
    without its file, or with one of another dtype or number of dimensions, is left out and reported.
    """
    if name in source.fields or name in ("labels", "images", "label", "boxes", "mask", "text"):
        raise UsageError(f"--array {name}=...: the name {name!r} is taken; choose another")
    tree = open_tree(folder, storage_options)
    rels = {rel: f"{rel.rsplit('.', 1)[0]}.npy" for rel in source.paths}
    found = {r: tree.stat(n) for r, n in rels.items()}
    data = tree.read_many([n for r, n in rels.items() if not isinstance(found[r], str)], ARRAY_FILE_MAX_BYTES)
    headers = {r: _npy_header(data[n]) if isinstance(data.get(n), bytes) else (data.get(n) or found[r])
               for r, n in rels.items()}  # fmt: skip
    good = [h for h in headers.values() if not isinstance(h, str)]
    if not good:
        raise UsageError(
            f"{folder} holds no usable .npy array for any input (named as the images, a/b.jpg -> a/b.npy)"
        )
    dtype, first = good[0]
    keep, ignored, files = [], [], []
    for i, rel in enumerate(source.paths):
        h = headers[rel]
        if not isinstance(h, str) and (h[0] != dtype or len(h[1]) != len(first)):
            h = f"{h[0].str}{list(h[1])}, the first array is {dtype.str}{list(first)}"
        if isinstance(h, str):
            ignored.append((rel, f"array {name} at {folder}/{rels[rel]}: {h}"))
            continue
        keep.append(i)
        files.append([rels[rel], *found[rel]])
    shapes = [headers[source.paths[i]][1] for i in keep]
    shape = [d if all(s[k] == d for s in shapes) else None for k, d in enumerate(first)]
    out = source.subset(keep, ignored)
    targets = []
    for t, f in zip(out.targets or [None] * len(out), files):
        t = dict(t or {})
        t["arrays"] = {**t.get("arrays", {}), name: f}
        targets.append(t)
    root = str(folder) if is_url(folder) else str(Path(folder).resolve())
    extra = dict(out.extra) | {"arrays": {**out.extra.get("arrays", {}), name: root}}
    spec = FieldSpec("array", {"dtype": dtype.str, "shape": shape})
    return out.with_targets(out.fields | {name: spec}, targets, out.dropped, extra)
