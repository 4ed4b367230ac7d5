"""cachekit: decode and preprocess an image dataset once into a sharded cache, then feed training fast."""

from . import transforms
from .build.run import BuildConfig, BuildResult, SplitsResult, build
from .build.sources import Source, discover
from .build.sources.sourceoptions import SourceOptions
from .constants import VERSION as __version__
from .cpus import available_cpus
from .errors import BuildError, CacheError, CachekitError, NotACacheError, UsageError
from .feed.batch import SampleBatch, collate_batch, pad_collate
from .feed.dataset import CachedDataset
from .feed.loader import CacheLoader, make_loader, suggest_num_workers
from .feed.mix import MixedDataset, mix
from .feed.sampler import ShardAwareDistributedSampler
from .image.recipes import Pipeline, load_pipeline
from .store.location import read_manifest
from .store.manifest import FieldSpec, Manifest, SampleSpec, ShardInfo
from .tools.autobatch import autobatch
from .tools.convert import convert
from .tools.doctor import DoctorReport, diagnose
from .tools.preview import preview
from .tools.trace import add_stages, stage_times, trace_handler
from .tools.verify import VerifyReport, verify
from .transforms import *  # noqa: F403  (every transform, as cachekit.transforms lists them)

__all__ = [
    "__version__",
    "BuildConfig",
    "BuildResult",
    "SplitsResult",
    "build",
    "CachedDataset",
    "mix",
    "MixedDataset",
    "SampleBatch",
    "collate_batch",
    "pad_collate",
    "CachekitError",
    "CacheError",
    "NotACacheError",
    "BuildError",
    "UsageError",
    "Manifest",
    "SampleSpec",
    "ShardInfo",
    "read_manifest",
    "Pipeline",
    "load_pipeline",
    "Source",
    "SourceOptions",
    "ShardAwareDistributedSampler",
    "CacheLoader",
    "make_loader",
    "suggest_num_workers",
    "transforms",
    *transforms.__all__,
    "FieldSpec",
    "available_cpus",
    "autobatch",
    "discover",
    "verify",
    "VerifyReport",
    "convert",
    "diagnose",
    "DoctorReport",
    "preview",
    "add_stages",
    "stage_times",
    "trace_handler",
]
