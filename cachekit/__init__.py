"""cachekit: decode and preprocess an image dataset once into a sharded cache, then feed training fast."""

from .autobatch import autobatch
from .build import BuildConfig, BuildResult, build
from .constants import VERSION as __version__
from .convert import convert
from .cpus import available_cpus
from .dataset import CachedDataset, SampleBatch, collate_batch, pad_collate
from .doctor import DoctorReport, diagnose
from .errors import BuildError, CacheError, CachekitError, UsageError
from .loader import CacheLoader, make_loader, suggest_num_workers
from .manifest import Manifest, SampleSpec, ShardInfo, read_manifest
from .pipelines import Pipeline, load_pipeline
from .sampler import ShardAwareDistributedSampler
from .sources import Source, discover
from .verify import VerifyReport, verify

__all__ = [
    "__version__",
    "BuildConfig",
    "BuildResult",
    "build",
    "CachedDataset",
    "SampleBatch",
    "collate_batch",
    "pad_collate",
    "CachekitError",
    "CacheError",
    "BuildError",
    "UsageError",
    "Manifest",
    "SampleSpec",
    "ShardInfo",
    "read_manifest",
    "Pipeline",
    "load_pipeline",
    "Source",
    "ShardAwareDistributedSampler",
    "CacheLoader",
    "make_loader",
    "suggest_num_workers",
    "available_cpus",
    "autobatch",
    "discover",
    "verify",
    "VerifyReport",
    "convert",
    "diagnose",
    "DoctorReport",
]
