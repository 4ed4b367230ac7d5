"""Parquet files as a build's source, in the Hugging Face layout: an ``image`` column of
``{bytes, path}`` structs (or plain bytes), a ``label`` class, an ``objects`` struct of ``bbox`` and
``category`` lists, a caption column; class names from the ``huggingface`` schema metadata.

Discovery reads each file's footer and its small columns (never the images); a shard job reads
the image column of the row groups its rows lie in, one row group at a time, so no worker holds
more than a row group's images. Rows keep their files' order (a shard is a run of rows); a file
that is not Parquet, is cut short or lacks the image column is left out with its reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...constants import DIST_NAME
from ...errors import UsageError
from ...image.ops import DecodeError
from .inputtable import Source
from .layouts import PARQUET, Request
from .recordfiles import RecordFile, RecordRows, find_files, open_file
from .samples import json_target
from .sourceoptions import SourceOptions

__all__ = ["discover", "parquet_source", "ParquetReader", "hf_class_names"]


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"reading Parquet needs pyarrow: pip install '{DIST_NAME}[parquet]'") from None
    return pq


def _names_in(feature) -> list[str] | None:
    """The first ``names`` list (a ``ClassLabel``) inside a Hugging Face feature description."""
    if isinstance(feature, dict):
        if isinstance(feature.get("names"), list):
            return [str(n) for n in feature["names"]]
        for key in ("feature", "category", *feature):
            found = _names_in(feature.get(key)) if key in feature else None
            if found:
                return found
    if isinstance(feature, list):
        for item in feature:
            found = _names_in(item)
            if found:
                return found
    return None


def hf_class_names(metadata: dict | None, column: str) -> list[str] | None:
    """Class names of ``column`` from a schema's ``huggingface`` metadata, when it has them."""
    raw = (metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        features = json.loads(raw).get("info", {}).get("features", {})
        return _names_in(features.get(column)) if isinstance(features, dict) else None
    except (ValueError, AttributeError, RecursionError):  # metadata nested past Python's stack: no names
        return None


@dataclass(frozen=True)
class ParquetReader:
    """A shard job's reads: the image of a row, its row group's image column read once."""

    files: tuple[str, ...]
    url: bool
    column: str
    sequential = True  # rows are read in their files' order, a row group at a time

    def open(self, storage_options: dict | None, max_bytes: int):
        pq = _pyarrow()
        state: dict = {"at": None, "rows": None, "file": None, "index": None}

        def read(rel: str, target) -> bytes:
            f, group, row = target["at"]
            if state["at"] != (f, group):
                if state["index"] != f:
                    if state["file"] is not None:
                        state["file"].close()
                    state["file"], state["index"] = (
                        pq.ParquetFile(open_file(self.files[f], self.url, storage_options), pre_buffer=False),
                        f,
                    )
                state["rows"] = None  # the previous row group goes before the next one comes
                table = state["file"].read_row_group(group, columns=[self.column], use_threads=False)
                state["rows"], state["at"] = table.column(0).to_pylist(), (f, group)
            value = state["rows"][row]
            if isinstance(value, dict):
                value = value.get("bytes")
            if not value:
                raise DecodeError(f"no image bytes in column {self.column!r}")
            if max_bytes and len(value) > max_bytes:
                raise DecodeError(f"{len(value)} bytes, over the {max_bytes}-byte limit (see --max-pixels)")
            return bytes(value)

        return read


def _objects(value) -> dict:
    """Hugging Face's ``objects`` (``bbox``, ``category``, maybe ``iscrowd`` and ``keypoints``) in the
    schema's names."""
    if value is None:
        return {"boxes": []}
    if not isinstance(value, dict):
        raise DecodeError("the boxes column is not a struct of bbox and category lists")
    boxes = value.get("bbox", value.get("boxes"))
    out = {"boxes": boxes if boxes is not None else []}
    classes = value.get("category", value.get("classes", value.get("label")))
    if classes is not None:
        out["classes"] = classes
    if value.get("iscrowd") is not None:
        out["iscrowd"] = value["iscrowd"]
    if value.get("keypoints") is not None:  # [N, K, 3] or [N, K, 2], one block per box
        out["keypoints"] = value["keypoints"]
    return out


def _file_rows(pq, file: RecordFile, url: bool, f: int, options: SourceOptions, storage_options):
    """``(rows, names, problem)``: each row's ``(target, label)`` or a reason, and the file's class names."""
    try:
        with open_file(file.where, url, storage_options) as fh:
            # read and decode in this thread: a buffer of the Python file object that one of pyarrow's
            # threads (a read ahead, a decode) drops while the process ends aborts it ("terminate
            # called without an active exception", exit 134 after a refusal's one line)
            pf = pq.ParquetFile(fh, pre_buffer=False)
            schema = pf.schema_arrow
            # a label or boxes column under its default name is optional; one the user named is not
            optional = {"label": options.label_column, "objects": options.boxes_column}
            named = (options.image_column, options.text_column, *(c for d, c in optional.items() if c != d))
            missing = next((c for c in named if c is not None and c not in schema.names), None)
            if missing is not None:  # a --text-column the file lacks: not a cache without captions
                return ([], None, f"no column {missing!r} (it has {', '.join(schema.names)[:200]})")
            wanted = [
                c
                for c in (options.label_column, options.boxes_column, options.text_column)
                if c in schema.names
            ]
            names = hf_class_names(schema.metadata, options.label_column) or hf_class_names(
                schema.metadata, options.boxes_column
            )
            rows = []
            sample_options = options.samples()
            for group in range(pf.num_row_groups):
                n = pf.metadata.row_group(group).num_rows
                table = pf.read_row_group(group, columns=wanted, use_threads=False) if wanted else None
                columns = {c: table.column(c).to_pylist() for c in wanted} if table is not None else {}
                for row in range(n):
                    target = {}
                    if options.label_column in columns and columns[options.label_column][row] is not None:
                        target["label"] = columns[options.label_column][row]
                    if options.boxes_column in columns:
                        try:
                            target.update(_objects(columns[options.boxes_column][row]))
                        except DecodeError as exc:
                            rows.append(((group, row), str(exc)))
                            continue
                    if options.text_column in columns:
                        target["text"] = columns[options.text_column][row] or ""
                    try:
                        raw, label = json_target(target, sample_options)
                    except DecodeError as exc:
                        rows.append(((group, row), str(exc)))
                        continue
                    rows.append(((group, row), (raw | {"at": [f, group, row]}, label)))
            return rows, names, None
    except DecodeError:
        raise
    except Exception as exc:  # not Parquet, cut short, unreadable: this file's problem
        return (
            [],
            None,
            f"not a readable Parquet file ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})",
        )


def parquet_source(pattern: str, options: SourceOptions, storage_options: dict | None = None) -> Source:
    """The rows of the Parquet files ``pattern`` names, in file and row order, with their targets."""
    pq = _pyarrow()
    url = "://" in pattern
    files = find_files(pattern, storage_options, PARQUET.files_noun)
    found, names, most = RecordRows(), None, options.limit()
    for f, file in enumerate(files):
        if most is not None and len(found.paths) >= most:
            break  # --max-samples: the first rows only
        rows, file_names, problem = _file_rows(pq, file, url, f, options, storage_options)
        if problem is not None:
            found.ignored.append((file.name, problem))
            continue
        names = names or file_names
        for (group, row), sample in rows:
            rel = f"{file.name}/{group}/{row}"
            if most is not None and len(found.paths) >= most:
                break
            if isinstance(sample, str):
                found.ignored.append((rel, sample))
                continue
            found.add(rel, sample[0], sample[1], file)
    return found.source(
        pattern,
        PARQUET.name,
        files,
        options,
        kind="Parquet files",
        names=names,
        reader=ParquetReader(tuple(f.where for f in files), url, options.image_column),
        identity=f"image_column:{options.image_column}",  # the other columns are in the targets
        unit="rows",
    )


def discover(request: Request) -> Source:
    """``base.SourceKind``: the rows of the Parquet files RAW names, read with the build's source options."""
    return parquet_source(request.text, request.config.source, request.config.storage_options)
