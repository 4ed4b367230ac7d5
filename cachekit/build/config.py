"""The options of one build (``BuildConfig``) and what it reports (``BuildResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..constants import DEFAULT_FORMAT, DEFAULT_MAX_PIXELS, DEFAULT_PIPELINE
from ..image.geometry import DEFAULT_MIN_VISIBILITY
from ..store.manifest import Manifest
from .sources.sourceoptions import SourceOptions

__all__ = ["BuildConfig", "BuildResult", "SplitsResult"]


@dataclass(frozen=True)
class BuildConfig:
    """Options of one build; ``None`` means "choose a sensible default"."""

    format: str = DEFAULT_FORMAT
    pipeline: str = DEFAULT_PIPELINE
    size: int | None = None
    workers: int | None = None
    shard_size: int | None = None
    labels: str | Path | None = None
    #: Boxes: a COCO instances JSON, or ``"yolo"`` / a YOLO ``data.yaml`` (``RAW/images`` + ``RAW/labels``).
    annotations: str | Path | None = None
    #: A folder with a class-map PNG per input, named as the input (``a/b.jpg`` -> ``a/b.png``).
    masks: str | Path | None = None
    #: A text file naming the mask values' classes, one a line (value 0 the first line).
    mask_classes: str | Path | None = None
    #: A text file of class names, one a line, or a list of names: the class order of any source (a
    #: name's index its line).
    classes: str | Path | list | tuple | None = None
    #: Boxes keeping less of their area than this through the recipe (or a variant's crop) are dropped.
    min_visibility: float = DEFAULT_MIN_VISIBILITY
    #: Array fields: name -> a folder with a ``.npy`` per input (``a/b.jpg`` -> ``a/b.npy``).
    arrays: dict = field(default_factory=dict)
    strict: bool = False
    overwrite: bool = False
    update: bool = False
    fast_decode: bool = False
    augment: int = 0  # variants per input; 0 = no augmentation
    seed: int = 0  # of the shuffled order and of --augment's draws
    augment_rotate: float = 0.0
    compression: str = "none"
    store: str = "pixels"  # "pixels-hwc": channels-last; "jpeg" / "png": kept encoded, decoded on read
    quality: int = 90  # --store jpeg
    order: str = "shuffled"  # or "sorted": path order, contiguous shards
    shards: int | None = None  # --order shuffled: how many shards (default: inputs / shard size)
    max_pixels: int = DEFAULT_MAX_PIXELS  # largest input decoded (width x height); 0: no limit
    grace: float | None = None  # seconds a retired shard stays for old readers (None: 24 h)
    executor: str = "local"
    executor_options: dict = field(default_factory=dict)
    progress: bool = True
    #: How to reach RAW and ``out`` when they are URLs (``{"endpoint_url": ..., "key": ...,
    #: "secret": ...}``), for fsspec only: sent to every worker process as plain data, never written
    #: into the cache, never shown (not even by ``repr``).
    storage_options: dict = field(default_factory=dict, repr=False)
    #: Python datasets, Parquet files and tars: class names, box format, columns, ``source_id``.
    source: SourceOptions = field(default_factory=SourceOptions)
    #: A RAW that names splits (data.yaml, Hugging Face file names, ``train/`` ``val/`` folders) builds
    #: one cache per split at ``out/<split>``: these only (``"train,val"`` or a list); None: all.
    split: str | tuple | list | None = None


@dataclass(frozen=True)
class BuildResult:
    manifest: Manifest
    path: str  # the cache folder or URL
    status: str  # "built" | "up to date" | "updated" | "resumed"
    built_shards: int
    reused_shards: int
    seconds: float
    retired: int = 0  # shards of earlier versions kept for their readers (see --grace)
    removed: int = 0  # retired shards this build removed, their grace period over

    @property
    def skipped(self) -> int:
        return len(self.manifest.skipped)

    def summary(self) -> str:
        m = self.manifest
        rate = m.num_samples / self.seconds if self.seconds > 0 else 0.0
        unread = m.source.get("unread")
        not_read = (
            f", {', '.join(f'{n} {ext}' for ext, n in unread.items())} not read (unsupported format)"
            if isinstance(unread, dict) and unread
            else ""
        )
        return (
            f"{self.status}: {m.num_samples} samples, {self.skipped} skipped{not_read}, {len(m.shards)} shards "
            f"({self.reused_shards} reused), {m.total_bytes / 1e6:.1f} MB, {self.seconds:.1f} s "
            f"({rate:.0f} samples/s) -> {self.path}"
        )


@dataclass(frozen=True)
class SplitsResult:
    """What a build of a RAW that names splits reports: one ``BuildResult`` per split built, each
    a cache of its own at ``path/<split>``; ``overlaps``: inputs found in more than one split."""

    path: str  # the folder (or URL) holding the splits' caches
    results: dict  # split name -> BuildResult, in the splits' order
    origin: str  # what named the splits
    overlaps: int = 0

    def __getitem__(self, name: str) -> BuildResult:
        return self.results[name]

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.results)

    def summary(self) -> str:
        """One line per split (as ``BuildResult.summary``), then one line naming the splits and counts."""
        counts = ", ".join(f"{n} {r.manifest.num_samples}" for n, r in self.results.items())
        lines = [r.summary() for r in self.results.values()]
        lines.append(
            f"{len(self.results)} split{'s' if len(self.results) != 1 else ''} named by {self.origin}, "
            f"one cache each: {counts} samples -> {self.path.rstrip('/')}/<split>"
        )
        return "\n".join(lines)
