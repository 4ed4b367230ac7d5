"""A build's targets beside the images of any source: a folder of masks, folders of arrays, and the
``Tree`` that annotation sources (``coco``, ``yolo``, ``voc``) reach files through.

``add_masks`` gives any source a ``mask`` field, ``add_arrays`` an array field. Each input's raw target (its boxes in its own
pixels, or YOLO's normalised rows, its mask file) travels with it to the shard job
(``sampletargets``), where the image's decoded size is known; they are part of the inputs'
digest, so a changed annotation or mask rebuilds its shard. Files are reached through a ``Tree``:
a local folder (``os.stat``) or one listing of a URL.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...errors import BuildError, CacheError, UsageError
from ...store.fields import ARRAY_DTYPES, FieldSpec, check_field_name, target_keys
from ...store.fields.keypoints import flip_pairs
from ...store.limits import MAX_ARRAY_BYTES
from ...store.remote import access_error, filesystem, is_url
from .classnames import voc_palette_names
from .inputtable import Source, Walk, file_problem, is_image_name, path_key, stat_problem, walk
from .layouts import FLAT, IMAGEFOLDER
from .objectstore import remote_files
from .reading import read_input

__all__ = [
    "Tree",
    "open_tree",
    "keypoints_field",
    "add_masks",
    "add_arrays",
    "check_some_kept",
    "MASK_EXTENSION",
]

MASK_EXTENSION = ".png"


class Tree:
    """The files under a root folder or URL: their (size, mtime_ns), the images below a folder, bytes."""

    def __init__(self, root: str | Path, storage_options: dict | None = None) -> None:
        self.root = root
        self.url = is_url(root)
        self._files: dict[str, tuple[int, int]] | None = None
        self._fs = self._base = None
        if self.url:
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
        """``(rel, size, mtime)`` of the images below ``top`` ("" for all), what was left out, and
        unread counts."""
        if self._files is not None:
            prefix = f"{top}/" if top else ""
            rows = [(r, *v) for r, v in self._files.items() if r.startswith(prefix) and is_image_name(r)]
            return sorted(rows, key=lambda r: path_key(r[0])), [], {}
        found = Walk()
        walk(Path(self.root), top, found)
        return sorted(found.files, key=lambda r: path_key(r[0])), found.ignored, dict(found.unread)

    def read_head(self, rel: str, n: int) -> bytes | str:
        """The first ``n`` bytes of a regular file (never a FIFO's wait), or why they cannot be read."""
        if self._fs is not None:
            try:
                return self._fs.cat_file(f"{self._base}/{rel}", start=0, end=n)
            except Exception as exc:
                return f"cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:100]})"
        try:
            fd = os.open(Path(self.root) / rel, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "not a regular file"
            return os.read(fd, n)
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"
        finally:
            os.close(fd)

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


def keypoints_field(names: list[str] | None, skeleton=None, flip_idx=None, k: int | None = None) -> FieldSpec:
    """The keypoints field of a pose source: K, and the names, skeleton and flip_idx it knows (flip_idx
    paired from ``left_``/``right_`` names when not given)."""
    params: dict = {"boxes": "boxes", "k": k if k is not None else len(names)}
    if names:
        params["names"] = list(names)
    if skeleton:
        params["skeleton"] = [list(e) for e in skeleton]
    flip_idx = flip_idx if flip_idx is not None else flip_pairs(names) if names else None
    if flip_idx is not None:
        params["flip_idx"] = list(flip_idx)
    return FieldSpec("keypoints", params)


def check_some_kept(what: str, kept: int, dropped, fix: str = "") -> None:
    """Stop a build whose annotations were every one left out (``kept`` none, ``dropped`` some, each
    ``(where, reason)``): its cache would hold the images with no targets, the build a success. One
    line (BuildError, exit 1): ``what`` (the annotations), how many, the first with its reason, and
    ``fix`` when the source can tell it. Losing some is reported with the cache, not fatal."""
    if kept or not dropped:
        return
    where, reason = dropped[0]
    head = f"{what}: every annotation was left out ({len(dropped)}; the first, {where}: {reason})"
    raise BuildError(f"{head}: {fix}" if fix else f"{head}, so no image would hold one")


def add_masks(
    source: Source,
    masks: str | os.PathLike,
    storage_options: dict | None = None,
    mask_classes: tuple[str, ...] | None = None,
) -> Source:
    """``source`` with a ``mask`` field: for each input ``a/b.jpg`` the class map ``MASKS/a/b.png``.

    An input without its mask cannot be trained on: it is left out and reported, with the path looked for.
    Class folders stay the images' classes (a ``label`` field), but a single folder is no class.
    The field records its class names: ``mask_classes``, else VOC's when the first mask is a VOC
    palette PNG; a source with no classes of its own takes them as its classes too.
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
    if out.layout == IMAGEFOLDER.name and len(np.unique(out.labels)) <= 1:
        # one folder of images (RAW/images/*.jpg) is no class: a mask cache needs none
        out = replace(out, layout=FLAT.name, labels=np.full(len(out), -1, dtype=np.int64), classes=())
    targets = [dict(t or {}) | {"mask": m} for t, m in zip(out.targets or [None] * len(out), found)]
    extra = dict(out.extra) | {"masks": str(masks) if is_url(masks) else str(Path(masks).resolve())}
    if mask_classes is None:
        first = tree.read_many([found[0][0]], 1 << 20).get(found[0][0])
        mask_classes = voc_palette_names(first) if isinstance(first, bytes) else None
    spec = FieldSpec("mask", {"classes": list(mask_classes)} if mask_classes else {})
    if mask_classes and not out.classes:
        out = replace(out, classes=tuple(mask_classes))
    return out.with_targets(
        _with_label(out, out.fields) | out.fields | {"mask": spec}, targets, out.dropped, extra
    )


#: Largest ``.npy`` file a build reads as one sample's array.
ARRAY_FILE_MAX_BYTES = MAX_ARRAY_BYTES + (1 << 16)
#: Bytes of a ``.npy`` file read to know its dtype and shape (numpy's own header limit is 10,000).
_NPY_HEAD = 16384


def _npy_header(data: bytes) -> tuple[np.dtype, tuple[int, ...]] | str:
    """The dtype and shape a ``.npy`` file's first bytes declare (nothing pickled is read), or why it
    cannot be used."""
    import io

    fh = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fh)
        read = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(fh)
    except (ValueError, OSError, SyntaxError, EOFError) as exc:
        return f"not a .npy file ({' '.join(str(exc).split())[:100]})"
    if dtype.hasobject:
        return "a .npy file of Python objects (only numbers are read)"
    le = dtype.newbyteorder("<") if dtype.byteorder not in ("=", "|", "<") or dtype.itemsize > 1 else dtype
    if le.str not in ARRAY_DTYPES:
        return f"dtype {dtype.str} (an array field takes {', '.join(ARRAY_DTYPES)})"
    if any(d < 0 for d in shape) or int(np.prod(shape)) * le.itemsize > MAX_ARRAY_BYTES:
        return f"{list(shape)} {le.str}: over the {MAX_ARRAY_BYTES // 2**20} MiB an array field may hold a sample"
    return le, tuple(int(v) for v in shape)


def _with_label(source: Source, fields: dict) -> dict:
    """A source whose images have classes keeps them in its target when another field comes."""
    if not fields and source.classes and (source.labels >= 0).any():
        return {"label": FieldSpec("label")}
    return fields


#: Target keys a new field may not take: those of the kinds a build makes.
_TAKEN = {"label", "labels", "boxes", "classes", "iscrowd", "mask", "text"}


def add_arrays(
    source: Source, name: str, folder: str | os.PathLike, storage_options: dict | None = None
) -> Source:
    """``source`` with an ``array`` field ``name``: for each input ``a/b.jpg`` the array ``FOLDER/a/b.npy``.

    Its dtype and number of dimensions are most inputs' (only each file's header is read); its
    shape theirs, with ``null`` where they differ. An input without its file, or with one of another
    dtype or number of dimensions, is left out and reported.
    """
    taken = _TAKEN | {k for n, spec in source.fields.items() for k in target_keys(n, spec)}
    try:
        check_field_name(name, taken, f"--array {name}=...")
    except CacheError as exc:
        raise UsageError(str(exc)) from None
    tree = open_tree(folder, storage_options)
    rels = {rel: f"{rel.rsplit('.', 1)[0]}.npy" for rel in source.paths}
    headers: dict[str, tuple | str] = {}
    found: dict[str, tuple[int, int] | str] = {}
    for rel, npy in rels.items():
        found[rel] = tree.stat(npy)
        if isinstance(found[rel], str):
            headers[rel] = found[rel]
            continue
        head = tree.read_head(npy, _NPY_HEAD)
        headers[rel] = _npy_header(head) if isinstance(head, bytes) else head
    good = Counter((h[0].str, len(h[1])) for h in headers.values() if not isinstance(h, str))
    if not good:
        raise UsageError(
            f"{folder} holds no usable .npy array for any input (named as the images, a/b.jpg -> a/b.npy)"
        )
    (dtype, ndim), _ = good.most_common(1)[0]
    keep, ignored, files = [], [], []
    for i, rel in enumerate(source.paths):
        h = headers[rel]
        if not isinstance(h, str) and (h[0].str, len(h[1])) != (dtype, ndim):
            h = f"{h[0].str}{list(h[1])}, where most are {dtype} of {ndim} dimensions"
        if isinstance(h, str):
            ignored.append((rel, f"array {name} at {folder}/{rels[rel]}: {h}"))
            continue
        keep.append(i)
        files.append([rels[rel], *found[rel]])
    shapes = [headers[source.paths[i]][1] for i in keep]
    shape = [d if all(s[k] == d for s in shapes) else None for k, d in enumerate(shapes[0])]
    out = source.subset(keep, ignored)
    targets = []
    for t, f in zip(out.targets or [None] * len(out), files):
        t = dict(t or {})
        t["arrays"] = {**t.get("arrays", {}), name: f}
        targets.append(t)
    root = str(folder) if is_url(folder) else str(Path(folder).resolve())
    extra = dict(out.extra) | {"arrays": {**out.extra.get("arrays", {}), name: root}}
    spec = FieldSpec("array", {"dtype": dtype, "shape": shape})
    return out.with_targets(
        _with_label(out, out.fields) | out.fields | {name: spec}, targets, out.dropped, extra
    )
