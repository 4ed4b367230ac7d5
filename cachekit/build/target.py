"""What one cache build writes, resolved from its inputs and options before any work (``Target``): the
``Source``, the recipe and the stored sample's spec, the shard format and its options, the
augmentation and the fingerprint of the content. Every option no build of these inputs can honour
is refused here, before anything is written.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CacheError, UsageError
from ..image.recipes import Pipeline, load_pipeline
from ..store.encoding import check_store
from ..store.formats import get_format
from ..store.location import Location, open_location
from ..store.manifest import ArraySpec, SampleSpec
from .config import BuildConfig
from .findsource import Detected, find_source
from .guards import check_config
from .offline_variants import AUGMENT_EXTRAS, AugmentConfig
from .shardplan import Content
from .sources.classnames import read_names_file, with_class_order
from .sources.inputtable import Source
from .sources.layouts import layout_named

__all__ = ["Target", "resolve_target", "probe_shape"]


@dataclass(frozen=True)
class Target:
    """What a build writes, resolved from its inputs and options."""

    raw: Path | str
    out: Location
    source: Source
    pipeline: Pipeline
    spec: SampleSpec
    content: Content
    content_fp: str
    augment: AugmentConfig | None
    extension: str


def probe_shape(pipeline: Pipeline) -> tuple[int, int | None, int | None]:
    """The stored sample shape ``[3, H, W]``, found by running the recipe on two unlike images.

    A recipe whose output size follows its input's (no final crop or letterbox) gives ragged
    samples: ``[3, None, None]``, each stored at its own size.
    """
    shapes = set()
    for h, w in ((97, 131), (413, 288)):
        out, _ = pipeline.apply(np.zeros((h, w, 3), dtype=np.uint8))
        shapes.add(out.shape)
    if len(shapes) != 1:
        return (3, None, None)
    h, w, c = shapes.pop()
    return (c, h, w)


def resolve_target(
    raw: str | os.PathLike,
    out: str | os.PathLike,
    config: BuildConfig,
    *,
    found: tuple[Path | str, Source] | None = None,
    detected: Detected | None = None,
) -> Target:
    """What building ``raw`` into ``out`` with ``config`` writes (``found``: RAW and its ``Source``,
    when the caller discovered them; ``detected``: RAW's layout, when the caller detected it)."""
    check_config(config)
    location = open_location(out, config.storage_options)
    location.exists()  # an --out that is a file is refused before any work
    raw, source = _source(raw, out, config, found, detected)
    pipeline = load_pipeline(config.pipeline, config.size)
    fmt = get_format(config.format)
    check_store(config.store, config.quality)
    options = {"compression": config.compression, "store": config.store}
    if config.store == "jpeg":
        options["quality"] = config.quality
    fmt.check_options(options)
    augment = (
        AugmentConfig(config.augment, config.seed, rotate=config.augment_rotate) if config.augment else None
    )
    spec = _spec(pipeline, source, augment)
    _check_decoding(config, source, spec, augment, pipeline)
    pipeline_json = pipeline.to_json() | {"fast_decode": config.fast_decode}
    if "boxes" in {f.kind for f in source.fields.values()}:
        pipeline_json["min_visibility"] = config.min_visibility
    if augment is not None:
        pipeline_json["augment"] = augment.to_json()
    content = Content(
        pipeline_json, fmt.name, options, spec.to_json(), source.classes, {"max_pixels": config.max_pixels}
    )
    return Target(
        raw, location, source, pipeline, spec, content, content.fingerprint(), augment, fmt.extension
    )


def _source(raw, out, config: BuildConfig, found, detected) -> tuple[Path | str, Source]:
    """RAW as the manifest names it and its ``Source``, in ``--classes``' order when given."""
    mask_names = read_names_file(config.mask_classes, "--mask-classes", 256) if config.mask_classes else None
    if mask_names is not None and config.masks is None:
        raise UsageError("--mask-classes names the values of --masks' class maps: give --masks too")
    if found is None:
        found = find_source(raw, out, config, mask_classes=mask_names, detected=detected)
    raw, source = found
    if config.classes is not None:  # one class order for any source
        source = with_class_order(source, read_names_file(config.classes, "--classes"), config.classes)
    return raw, source


def _spec(pipeline: Pipeline, source: Source, augment: AugmentConfig | None) -> SampleSpec:
    """The stored sample: the recipe's shape and extras (an augmented variant's too), the fields."""
    extras = {name: ArraySpec(shape, dtype) for name, (shape, dtype) in pipeline.extras.items()}
    if augment is not None:
        if set(extras) != {"orig_size"}:
            raise UsageError(
                f"--augment crops and rotates images, so it cannot keep {pipeline.name!r}'s per-sample "
                f"geometry ({', '.join(sorted(set(extras) - {'orig_size'}))}); use a classification recipe"
            )
        extras.update(AUGMENT_EXTRAS)
    spec = SampleSpec(shape=probe_shape(pipeline), extras=extras, fields=source.fields)
    kinds = spec.fields.values()
    unpaired = [
        f for f in kinds if f.kind == "keypoints" and f.params["k"] > 1 and "flip_idx" not in f.params
    ]
    if augment is not None and augment.flip > 0 and unpaired:
        warnings.warn(  # baked into the cache: each flipped variant's left points on the right
            "--augment stores flipped variants, and the keypoints have no flip_idx: each point keeps its "
            "index, so left and right are not swapped; give --flip-idx (0,1,2,... when no point has a "
            "mirror partner) or --keypoint-names with left_/right_ names",
            UserWarning,
            stacklevel=5,
        )
    try:  # what the manifest will say must read back: field names, sizes, no clash with a column
        SampleSpec.from_json(json.loads(json.dumps(spec.to_json())))
    except CacheError as exc:
        raise UsageError(f"these samples cannot be stored: {exc}") from None
    return spec


def _fast_decode_takes(source: Source) -> bool:
    """Whether ``source``'s layout may be decoded at a reduced size (its targets are not in the full
    image's pixels); a layout the table lacks may not."""
    row = layout_named(source.layout)
    return row is not None and row.fast_decode


def _check_decoding(
    config: BuildConfig, source: Source, spec: SampleSpec, augment: AugmentConfig | None, pipeline: Pipeline
) -> None:
    """Refuse ``--fast-decode`` where targets are in the full image's pixels, and ``--augment`` with
    a recipe whose output size follows its input's."""
    if (
        config.fast_decode
        and any(f.kind == "mask" for f in spec.fields.values())
        or (config.fast_decode and (not _fast_decode_takes(source) or source.reader is not None))
    ):
        raise UsageError(
            "--fast-decode decodes JPEGs at a reduced size, and masks and COCO, VOC and other sources' "
            "boxes are in the full image's pixels: leave --fast-decode out (YOLO's normalised boxes take it)"
        )
    if augment is not None and spec.ragged:
        raise UsageError(
            f"--augment needs a recipe with a fixed output size; {pipeline.name!r} keeps each image's"
        )
