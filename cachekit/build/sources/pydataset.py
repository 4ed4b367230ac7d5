"""A Python dataset as a build's source: anything with ``__len__`` and ``__getitem__`` (a
``torchvision.datasets`` object, your own ``Dataset``), split by index across the worker processes.

Workers receive the dataset by pickling (once per shard job, as the jobs themselves travel), so it
must pickle: a class defined at module level, holding paths rather than open files. Its inputs are
its indices (``000000000042``); what the first samples' targets carry decides the fields. Its
identity (``source_id=``, else its type and length) is part of every shard's name: a kill resumes,
and a changed ``source_id`` rebuilds (a sequence of one id per sample rebuilds only the shards
whose ids changed, under ``--update``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ...errors import UsageError
from ...image.ops import DecodeError
from ...store.limits import MAX_CLASSES, MAX_SAMPLES, short
from .classnames import read_names_file
from .inputtable import Source
from .layouts import DATASET, Request
from .records import Record, SourceRaised
from .samplefields import DECLARABLE, fields_of
from .samples import SampleOptions, to_record

__all__ = [
    "code_source",
    "discover",
    "IndexPaths",
    "DatasetReader",
    "dataset_source",
    "class_names",
    "index_path",
    "pickled",
    "PROBE",
    "probe_schema",
    "declared_fields",
    "own_class_names",
]

#: Samples read at discovery to learn the fields.
PROBE = 4
_LOADED: dict[str, object] = {}  # this process's unpickled dataset, by digest of its bytes


def index_path(i: int) -> str:
    """The input name of a dataset's sample ``i`` (sorts as the index)."""
    return f"{i:012d}"


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def pickled(dataset, what: str = "dataset") -> bytes:
    """The dataset's pickle, or one line saying why it cannot go to the worker processes."""
    try:
        return pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise UsageError(
            f"the {what} goes to the build's worker processes by pickling, and it cannot be pickled "
            f"({_one_line(exc)}): define its class at module level and keep open files, locks and "
            "lambdas out of it"
        ) from None


class IndexPaths(Sequence):
    """The input names of ``n`` indices, made when asked for (no ``n`` strings held)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(index_path(k) for k in range(*i.indices(self.n)))
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return index_path(i % self.n)


@dataclass(frozen=True)
class DatasetReader:
    """A shard job's access to the dataset: unpickled once per worker process, ``ds[i]`` per input."""

    data: bytes
    options: SampleOptions
    sequential = False  # any index is read as cheaply as the next

    def dataset(self):
        key = hashlib.sha256(self.data).hexdigest()
        if key not in _LOADED:
            _LOADED.clear()
            _LOADED[key] = pickle.loads(self.data)
        return _LOADED[key]

    def open(self, storage_options: dict | None, max_bytes: int):
        ds = self.dataset()
        return lambda rel, target: read_sample(ds, int(rel), self.options)


def read_sample(dataset, i: int, options: SampleOptions) -> Record:
    """``dataset[i]`` as a record; what the dataset raises is this sample's problem (``SourceRaised``)."""
    try:
        sample = dataset[i]
    except Exception as exc:  # the user's code
        raise SourceRaised(f"{_one_line(exc)} in __getitem__({i})") from None
    return to_record(sample, options)


def class_names(given, found, samples_have_classes: bool, what: str) -> tuple[str, ...]:
    """The class names: ``given`` (names, a file of names, or a number of classes), else ``found``
    (a dataset's own ``.classes``, a file's metadata); one line when the samples have classes and
    nothing names them."""
    if isinstance(given, (str, os.PathLike)):  # a file of names, one a line (as BuildConfig's classes)
        if not os.path.isfile(given):  # "ab" is not two classes 'a' and 'b'
            raise UsageError(
                f"classes={short(os.fspath(given))}: no such file of class names; give a list of names (in "
                "index order), a file of them or a number"
            )
        given = read_names_file(given, "classes=")
    names = given if given is not None else found
    if isinstance(names, (list, tuple, dict)) and not names:
        names = None  # an empty list names nothing
    if isinstance(names, (int, np.integer)) and not isinstance(names, bool):
        if not 0 < names <= MAX_CLASSES:
            raise UsageError(f"classes={names}: give 1 to {MAX_CLASSES} classes")
        return tuple(str(i) for i in range(int(names)))
    if isinstance(names, (str, bytes)):  # a string would be taken as one class a character
        raise UsageError(f"classes={short(names)}: give a list of names (in index order), a file or a number")
    if isinstance(names, dict):  # {index: name}, or torchvision's class_to_idx {name: index}
        names = _indexed_names(names)
    if names is not None:
        names = list(names)
        if not all(isinstance(n, (str, int)) for n in names) or len(names) > MAX_CLASSES:
            raise UsageError(f"class names must be a list of up to {MAX_CLASSES} strings")
        names = tuple(str(n) for n in names)
        twice = next((n for n, c in Counter(names).items() if c > 1), None)
        if twice is not None:
            raise UsageError(f"class names name {twice!r} twice: each class needs its own name")
        return names
    if samples_have_classes:
        raise UsageError(
            f"the {what}'s samples carry classes but nothing names them: pass classes=[...] (names in "
            "index order) or classes=N"
        )
    return ()


def _indexed_names(names: dict) -> list:
    """``{index: name}`` or ``{name: index}`` as names in index order; the indices must be 0 to n-1."""
    if names and all(isinstance(k, str) for k in names) and all(isinstance(v, int) for v in names.values()):
        if len(set(names.values())) != len(names):
            raise UsageError("classes as {name: index} give two names the same index")
        names = {v: k for k, v in names.items()}
    if set(names) != set(range(len(names))):
        raise UsageError(
            f"classes as a dict must map the indices 0 to {len(names) - 1} to names (or names to them), "
            f"got keys {short(sorted(map(str, names)))}"
        )
    return [names[k] for k in range(len(names))]


def _label_names(feature) -> list | None:
    """A ``ClassLabel``'s ``names`` inside a feature (a ``Sequence``'s ``feature``, a dict of them)."""
    for _ in range(4):  # Sequence(feature=...) or {"category": ClassLabel}, a few levels deep
        names = getattr(feature, "names", None)
        if isinstance(names, (list, tuple)) and names:
            return list(names)
        inner = getattr(feature, "feature", None)
        if inner is None and isinstance(feature, dict):
            inner = next((feature[k] for k in ("category", "label", "classes") if k in feature), None)
        if inner is None:
            return None
        feature = inner
    return None


def own_class_names(dataset):
    """A dataset's own class names: its ``.classes`` (torchvision), else the ``ClassLabel`` names of a
    Hugging Face ``datasets.Dataset``'s ``features`` (``label``, else ``objects``' category), in
    index order; read by duck typing (``datasets`` need not be installed)."""
    own = getattr(dataset, "classes", None)
    if own is not None:
        return own
    features = getattr(dataset, "features", None)
    if not hasattr(features, "get"):
        return None
    for column in ("label", "labels", "objects"):
        names = _label_names(features.get(column))
        if names:
            return names
    return None


def _identity(dataset, n: int, source_id) -> tuple[str, tuple]:
    """The source's identity and, for one id per sample, each sample's target ``{"id": ...}``."""
    if source_id is None:
        return f"{type(dataset).__module__}.{type(dataset).__qualname__}:{n}", ()
    if isinstance(source_id, (str, int)):
        return f"id:{source_id}", ()
    if isinstance(source_id, Sequence) and len(source_id) == n:
        ids = tuple(
            {"id": str(v)}
            for v in source_id
            if isinstance(v, (str, int, np.integer)) and not isinstance(v, bool)
        )
        if len(ids) == n:  # anything else prints differently each run (an address): never the same id
            return "ids", ids
    raise UsageError(
        "source_id= takes a string, or a sequence of one id per sample (strings or integers, as long as "
        "the dataset)"
    )


def declared_fields(fields) -> tuple[str, ...]:
    """``fields=``: the names of the fields samples from code have (besides those the first carry)."""
    if fields is None:
        return ()
    if isinstance(fields, str):
        fields = [fields]
    try:
        names = tuple(fields)
    except TypeError:
        names = (fields,)
    unknown = [n for n in names if n not in DECLARABLE]
    if unknown:
        raise UsageError(
            f"fields={short(list(names))}: a field is one of {', '.join(DECLARABLE)} (array fields are "
            "learnt from the first samples)"
        )
    return names


def probe_schema(reads, what: str, classes, own_classes, declared=()) -> tuple[dict, tuple[str, ...]]:
    """The fields and class names of a source from its first samples: ``reads`` yields ``(index,
    read)`` with ``read()`` giving a sample's record (a DecodeError: that sample is unusable);
    the fields any of them carries, and those ``declared`` (``declared_fields``); class names from
    ``classes`` (the user's), else ``own_classes`` (the source's ``.classes``)."""
    records, problems = [], []
    for i, read in reads:
        try:
            records.append(read())
        except DecodeError as exc:
            problems.append(f"sample {i}: {exc}")
    if not records:
        raise UsageError(f"the {what}'s first samples cannot be used ({'; '.join(problems)})")
    try:
        fields = fields_of(records, declared)
    except DecodeError as exc:
        raise UsageError(f"the {what}'s samples cannot be stored: {exc}") from None
    has_classes = any(r.label >= 0 for r in records) or bool({"boxes", "labels"} & set(fields))
    return fields, class_names(classes, own_classes, has_classes, what)


def dataset_source(
    dataset, options: SampleOptions, *, classes=None, source_id=None, fields=None, max_samples=None
) -> Source:
    """The ``Source`` of a map-style dataset: its indices, with what its first samples' targets carry."""
    try:
        n = len(dataset)
    except Exception as exc:
        raise UsageError(f"len() of the dataset raised {_one_line(exc)}") from None
    if not isinstance(n, int) or n <= 0:
        raise UsageError(f"the dataset has {n} samples: nothing to build")
    if n > MAX_SAMPLES:
        raise UsageError(f"len() of the dataset is {n}, over the {MAX_SAMPLES} samples a cache may hold")
    try:
        dataset[n - 1]
    except IndexError as exc:  # the commonest lie: a length past the end
        raise UsageError(
            f"len() of the dataset says {n} but dataset[{n - 1}] raises IndexError ({_one_line(exc)}): "
            "its __len__ is wrong"
        ) from None
    except Exception:
        pass  # that sample's own problem: skipped with its reason when the build reads it
    if max_samples is not None and max_samples < n:  # max_samples=: the first indices only
        if isinstance(source_id, Sequence) and not isinstance(source_id, str) and len(source_id) == n:
            source_id = source_id[:max_samples]  # one id per sample: the first samples' ids
        n = max_samples
    blob = pickled(dataset)
    reads = ((i, lambda i=i: read_sample(dataset, i, options)) for i in range(min(n, PROBE)))  # not a copy
    found, names = probe_schema(reads, "dataset", classes, own_class_names(dataset), declared_fields(fields))
    reader = DatasetReader(blob, replace(options, classes=len(names), fields=frozenset(found)))
    identity, targets = _identity(dataset, n, source_id)
    identity += (
        f"|boxes:{options.box_format}{'/normalized' if options.normalized else ''}"  # shapes its targets
    )
    return Source(
        root=f"<{type(dataset).__qualname__} of {n} samples>",
        layout=DATASET.name,
        paths=IndexPaths(n),
        labels=np.full(n, -1, dtype=np.int64),
        sizes=np.zeros(n, dtype=np.int64),
        mtimes=np.zeros(n, dtype=np.int64),
        classes=names,
        fields=found,
        targets=targets,
        extra={"dataset": f"{type(dataset).__module__}.{type(dataset).__qualname__}"},
        reader=reader,
        identity=identity,
    )


def discover(request: Request) -> Source:
    """``base.SourceKind``: a map-style dataset (``__len__`` and ``__getitem__``) with the build's options."""
    return code_source(dataset_source, request)


def code_source(make: Callable[..., Source], request: Request) -> Source:
    """The ``Source`` ``make`` (``dataset_source``, ``iterable.iterable_source``) makes of the user's
    object ``request.raw`` with the build's source options: ``classes=``, ``source_id=``, ``fields=``,
    ``--max-samples``."""
    options = request.config.source
    return make(
        request.raw,
        options.samples(),
        classes=options.classes,
        source_id=options.source_id,
        fields=options.fields,
        max_samples=options.limit(),
    )
