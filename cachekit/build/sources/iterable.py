"""An iterable of samples (a generator, an ``IterableDataset``: no ``__len__``) as a build's source:
read once, in order, in the build's process; its first samples say what fields it has.

Its inputs are positions in the stream (``000000000042``), cut into runs of the shard size as they
come (``streamrun``); a killed build reads the stream again and skips the positions whose shards
are finished. The stream's identity (``source_id=``, else the generator's or class's name) is part
of every shard's name: pass a new ``source_id`` when what it yields changes.
"""

from __future__ import annotations

import hashlib
import itertools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from ...errors import UsageError
from ...image.ops import DecodeError
from .inputtable import Source
from .layouts import STREAM, Request
from .pydataset import PROBE, code_source, declared_fields, index_path, own_class_names, probe_schema
from .records import Record, SourceRaised
from .samples import SampleOptions, to_record

__all__ = ["discover", "iterable_source", "StreamReader", "ChunkReader", "positions", "samples_digest", "LARGE_STREAM"]

#: Samples after which an iterable built without ``max_samples=`` is warned about (once): it may not end.
LARGE_STREAM = 10_000_000


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


@dataclass
class StreamReader:
    """The stream itself, kept in the build's process (never sent to a worker): its samples as
    records (or why each cannot be one), in order."""

    samples: Iterator
    options: SampleOptions
    limit: int | None = None  # max_samples=: the first this-many only
    stream = True  # read once, in order, by ``streamrun``
    sequential = True

    def records(self) -> Iterator[Record | str]:
        position = 0
        while self.limit is None or position < self.limit:
            if position == LARGE_STREAM and self.limit is None:
                warnings.warn(
                    f"the iterable has yielded {LARGE_STREAM} samples and goes on: an iterable that never "
                    "ends builds until the disk is full; pass max_samples= (--max-samples) to stop it",
                    UserWarning,
                    stacklevel=2,
                )
            try:
                sample = next(self.samples)
            except StopIteration:
                return
            except Exception as exc:  # the user's code: a generator that raised is over
                raise UsageError(f"the iterable raised at sample {position} ({_one_line(exc)})") from None
            try:
                yield to_record(sample, self.options)
            except DecodeError as exc:
                yield str(exc)
            position += 1

    def open(self, storage_options, max_bytes):  # every shard is built as the stream is read
        raise RuntimeError("a stream's shards are built by streamrun")


@dataclass(frozen=True)
class ChunkReader:
    """A shard job's run of a stream: its records (or why each could not be one), from ``start``."""

    start: int
    records: tuple
    sequential = True

    def open(self, storage_options, max_bytes):
        def read(rel: str, target) -> Record:
            found = self.records[int(rel) - self.start]
            if isinstance(found, str):
                raise SourceRaised(found)
            return found

        return read


def _identity(iterable, source_id) -> str:
    if source_id is None:
        name = getattr(iterable, "__qualname__", None) or type(iterable).__qualname__
        return f"stream:{type(iterable).__module__}.{name}"
    if isinstance(source_id, (str, int)):
        return f"id:{source_id}"
    raise UsageError("source_id= of an iterable takes a string (a stream has no per-sample ids)")


def iterable_source(
    iterable, options: SampleOptions, *, classes=None, source_id=None, fields=None, max_samples=None
) -> Source:
    """The ``Source`` of an iterable: no inputs yet (``streamrun`` reads them), the fields of its first
    samples, and a ``StreamReader`` over it (the samples peeked at are read again from it)."""
    try:
        samples = iter(iterable)
    except Exception as exc:
        raise UsageError(f"iter() of the source raised {_one_line(exc)}") from None
    peeked: list = []
    try:
        peeked.extend(itertools.islice(samples, min(PROBE, max_samples or PROBE)))
    except Exception as exc:  # the user's code: a generator that raised is over
        raise UsageError(f"the iterable raised at sample {len(peeked)} ({_one_line(exc)})") from None
    if not peeked:
        raise UsageError("the iterable yields no samples: nothing to build")
    reads = ((i, lambda s=s: to_record(s, options)) for i, s in enumerate(peeked))
    found, names = probe_schema(
        reads, "iterable", classes, own_class_names(iterable), declared_fields(fields)
    )
    return Source(
        root=f"<{type(iterable).__qualname__}>",
        layout=STREAM.name,
        paths=(),
        labels=np.zeros(0, dtype=np.int64),
        sizes=np.zeros(0, dtype=np.int64),
        mtimes=np.zeros(0, dtype=np.int64),
        classes=names,
        fields=found,
        extra={"dataset": f"{type(iterable).__module__}.{type(iterable).__qualname__}"},
        reader=StreamReader(
            itertools.chain(peeked, samples),
            replace(options, classes=len(names), fields=frozenset(found)),
            max_samples,
        ),
        identity=f"{_identity(iterable, source_id)}|boxes:{options.box_format}"
        + ("/normalized" if options.normalized else ""),
    )


def positions(start: int, count: int) -> tuple[str, ...]:
    """The input names of a stream's positions ``start`` .. ``start + count``."""
    return tuple(index_path(i) for i in range(start, start + count))


def _feed(h, value) -> None:
    """Hash ``value`` (a record's image, target or label) with its type and shape, so that no two
    different values feed the same bytes."""
    if isinstance(value, np.ndarray):
        h.update(f"a{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (bytes, bytearray, memoryview)):
        h.update(f"b{len(value)}:".encode())
        h.update(bytes(value))
    elif isinstance(value, dict):
        h.update(f"d{len(value)}:".encode())
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"l{len(value)}:".encode())
        for item in value:
            _feed(h, item)
    else:
        text = f"{type(value).__name__}:{value!r}".encode()
        h.update(f"s{len(text)}:".encode() + text)


def samples_digest(records) -> str:
    """sha256 of a run of a stream's records (their images, targets and classes; or why each could
    not be one): what a resumed build compares to tell that the stream repeated its samples."""
    h = hashlib.sha256()
    for record in records:
        if isinstance(record, Record):
            _feed(h, (record.image, record.target, record.label))
        else:
            _feed(h, ("skip", str(record)))
    return h.hexdigest()


def discover(request: Request) -> Source:
    """``base.SourceKind``: an iterable of samples (read once, in order, by ``streamrun``)."""
    return code_source(iterable_source, request)
