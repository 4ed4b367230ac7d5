"""Defaults and environment knobs, in one place."""

from __future__ import annotations

import logging
import os

__all__ = [
    "VERSION",
    "DIST_NAME",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "READABLE_MANIFEST_VERSIONS",
    "LOCK_NAME",
    "PARTIAL_DIR",
    "DEFAULT_FORMAT",
    "DEFAULT_PIPELINE",
    "DEFAULT_SHARD_BYTES",
    "DEFAULT_REMOTE_SHARD_BYTES",
    "MIN_SHARD_SAMPLES",
    "MAX_SHARD_SAMPLES",
    "IMAGE_EXTENSIONS",
    "UNREAD_IMAGE_EXTENSIONS",
    "DEFAULT_MAX_PIXELS",
    "MAX_ANNOTATIONS_BYTES",
    "RETIRED_NAME",
    "DEFAULT_GRACE_SECONDS",
    "SHUFFLE_WINDOW_SAMPLES",
    "SHUFFLE_BLOCK_SHARDS",
    "BACKGROUND_PIECE_BYTES",
    "BACKGROUND_REQUESTS",
    "env_int",
    "START_METHOD_ENV",
    "MAX_OPEN_SHARDS",
    "DEFAULT_STEP_MS",
    "MAX_SIDE",
    "MAX_AUGMENT",
    "MAX_JOB_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_EPOCH",
    "REMOTE_REPLY_SECONDS",
]

VERSION = "0.1.0"
#: The distribution name on the package index (the import package and the command are ``cachekit``).
DIST_NAME = "cachekit-vision"

#: Name of the file that makes a folder a cache; written last, atomically.
MANIFEST_NAME = "manifest.json"
#: Bumped whenever the on-disk contract changes incompatibly: the newest version this code writes.
#: A cache of image + class only is still written as version 3 (what it was before fields came), so
#: that rebuilding one gives the same bytes and fingerprint; a sample with fields needs version 4.
#: Version 5 keeps the shards in a binary index beside the manifest (``store/index.py``).
MANIFEST_VERSION = 5
#: Versions this code reads.
READABLE_MANIFEST_VERSIONS = (3, 4, 5)
#: Lock file held while a build writes into a cache folder.
LOCK_NAME = ".cachekit.lock"
#: Folder inside a cache where a build in progress keeps per-shard records (for resume).
PARTIAL_DIR = ".cachekit-partial"
#: Record of shard files an earlier cache version referenced, kept for its readers until removed.
RETIRED_NAME = ".cachekit-retired.json"

DEFAULT_FORMAT = "pt"
DEFAULT_PIPELINE = "classification-224"


def env_int(name: str, default: int) -> int:
    """An integer from the environment, or ``default`` when unset or empty; a value that is not a
    whole number (``1GB``) is the default too, with one warning line (read at import: an error
    here would be a traceback before any command could say it in one line)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        logging.getLogger("cachekit").warning(
            "%s=%r is not a whole number; using the default, %d", name, raw[:40], default
        )
        return default


#: Target bytes of decoded pixels per shard (so a shard is ~64-256 MB).
DEFAULT_SHARD_BYTES = env_int("CACHEKIT_SHARD_BYTES", 128 * 1024 * 1024)
#: The same for a cache written to object storage (an ``s3://`` ``--out``): smaller shards, since a
#: reader's first batch waits for one whole shard to download, yet large enough that requests
#: (billed and throttled per request) stay few; README's streaming figures put the balance at 16-64 MB.
DEFAULT_REMOTE_SHARD_BYTES = env_int("CACHEKIT_REMOTE_SHARD_BYTES", 32 * 1024 * 1024)
MIN_SHARD_SAMPLES = 16
MAX_SHARD_SAMPLES = 100_000
#: How long a retired shard stays for readers of the cache version that referenced it (``--grace``).
DEFAULT_GRACE_SECONDS = env_int("CACHEKIT_GRACE_SECONDS", 24 * 3600)

#: Largest annotations file (COCO JSON) a build reads: parsed whole, it takes several times its
#: size in memory (COCO's 448 MB train2017 file: ~4 GB).
MAX_ANNOTATIONS_BYTES = env_int("CACHEKIT_MAX_ANNOTATIONS_BYTES", 2 << 30)

#: Raw image extensions recognised by discovery (compared case-insensitively).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
#: Image extensions discovery recognises but does not read: counted and named in the build summary.
UNREAD_IMAGE_EXTENSIONS = (
    ".gif",
    ".heic",
    ".heif",
    ".avif",
    ".jxl",
    ".jp2",
    ".j2k",
    ".ico",
    ".svg",
    ".psd",
    ".dng",
    ".cr2",
    ".nef",
    ".arw",
    ".exr",
    ".hdr",
    ".ppm",
    ".pgm",
    ".pbm",
    ".pnm",
)
#: Largest image (width x height) a build decodes: twice PIL's MAX_IMAGE_PIXELS, where PIL raises
#: DecompressionBombError; checked from the file header before decoding (``--max-pixels``).
DEFAULT_MAX_PIXELS = 178_956_970

#: Samples the sampler shuffles together on caches whose shards are class-mixed (about 18 ImageNet
#: shards): reads stay within those shards; other caches are shuffled whole.
SHUFFLE_WINDOW_SAMPLES = env_int("CACHEKIT_SHUFFLE_WINDOW_SAMPLES", 16384)
#: Shards shuffled together on caches on object storage whose shards are class-mixed: a batch
#: then needs, and the node cache pins, a few shards at a time; a class-mixed shard mixes batches.
SHUFFLE_BLOCK_SHARDS = env_int("CACHEKIT_SHUFFLE_BLOCK_SHARDS", 8)

#: Bytes of one ranged GET of a download ahead from object storage: what a reader waiting for a
#: shard may find ahead of it on the link, per request in flight.
BACKGROUND_PIECE_BYTES = env_int("CACHEKIT_BACKGROUND_PIECE_BYTES", 2 * 1024 * 1024)
#: Ranged GETs of downloads ahead in flight at once, per process.
BACKGROUND_REQUESTS = env_int("CACHEKIT_BACKGROUND_REQUESTS", 4)

#: Environment variable choosing how build worker processes start (fork, forkserver, spawn).
START_METHOD_ENV = "CACHEKIT_START_METHOD"

#: Shard readers one process keeps open at most (0: derived from the open-file limit, RLIMIT_NOFILE).
MAX_OPEN_SHARDS = env_int("CACHEKIT_MAX_OPEN_SHARDS", 0)

#: ``cachekit doctor``'s simulated training step, in milliseconds, when no model is given.
DEFAULT_STEP_MS = 100.0

# -- limits on what a user asks for, checked before any work (README, "Limits") ----------------------

#: Largest side, in pixels, of an image a recipe (``--size``, every size its steps resolve to) or
#: a transform (``RandomResizedCrop``, ``CenterCrop``, ``Resize``) may ask for: a 8192 x 8192 RGB
#: image is 192 MiB.
MAX_SIDE = 8192
#: Most offline-augmented variants per input (``--augment``).
MAX_AUGMENT = 1024
#: Most bytes of decoded pixels one shard job holds at once (inputs a shard x variants x sample bytes).
MAX_JOB_BYTES = 16 * 1024**3
#: Most bytes of one batch a loader assembles (batch size x sample bytes, after augmentation).
MAX_BATCH_BYTES = 64 * 1024**3
#: Largest epoch a sampler accepts (``set_epoch``, a saved state).
MAX_EPOCH = 2**31 - 1
#: How long a command waits for object storage's first reply (reading a manifest, listing a
#: folder) before it gives up in one line; ``CACHEKIT_REMOTE_TIMEOUT`` overrides it.
REMOTE_REPLY_SECONDS = env_int("CACHEKIT_REMOTE_TIMEOUT", 60)
