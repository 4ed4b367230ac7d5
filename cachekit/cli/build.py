"""``cachekit build``: every option of a build, passed on to ``cachekit.build``."""

from __future__ import annotations

import warnings

import click

from ..constants import (
    DEFAULT_FORMAT,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_PIPELINE,
)
from ..image.geometry import DEFAULT_MIN_VISIBILITY
from ..image.recipes import builtin_pipelines
from .app import EXIT_CODES, duration, friendly, main, options_of, with_storage_options


@main.command("build", epilog=EXIT_CODES)
@click.argument("raw", type=click.Path(path_type=str))
@click.option("--out", required=True, type=click.Path(path_type=str), help="Cache folder to write.")
@click.option(
    "--format", "fmt", default=DEFAULT_FORMAT, show_default=True, help="Shard format: pt, hdf5 or zarr."
)
@click.option(
    "--pipeline",
    default=DEFAULT_PIPELINE,
    show_default=True,
    help=f"Preprocessing recipe: a built-in ({', '.join(builtin_pipelines())}; see `cachekit recipes`) "
    "or a path to your own .toml.",
)
@click.option("--size", type=int, default=None, help="Override the recipe's output side in pixels.")
@click.option(
    "--workers", type=int, default=None, help="Worker processes [default: the CPUs this process may use]."
)
@click.option(
    "--shard-size",
    type=int,
    default=None,
    help="Samples per shard [default: ~128 MB of pixels, ~32 MB for a URL --out; fewer for small datasets].",
)
@click.option(
    "--labels",
    type=click.Path(path_type=str),
    default=None,
    help="CSV of file,label (paths relative to RAW); only the files it lists are used. With a header "
    "row (file,label,labels,caption): 'labels' holds several ;-separated classes, 'caption' a text.",
)
@click.option(
    "--annotations",
    type=str,
    default=None,
    help="Boxes: a COCO instances JSON (file_name relative to RAW), 'yolo' / a YOLO data.yaml "
    "(RAW/images/** with RAW/labels/**.txt of 'class cx cy w h'), or 'voc' (RAW/Annotations/*.xml "
    "with RAW/JPEGImages/; 'difficult' kept as iscrowd).",
)
@click.option(
    "--masks",
    type=click.Path(path_type=str),
    default=None,
    help="Folder of class-map PNGs, one per input with its relative name (a/b.jpg -> MASKS/a/b.png); "
    "folders of RAW are then no classes.",
)
@click.option(
    "--mask-classes",
    type=click.Path(path_type=str),
    default=None,
    help="Text file naming the masks' classes, one a line (value 0 the first); default: VOC's names "
    "for VOC palette PNGs.",
)
@click.option(
    "--classes",
    type=click.Path(path_type=str),
    default=None,
    help="Text file of class names, one a line: the class order of any source (folders, --labels, "
    "COCO, YOLO), so the same class has the same index in every cache built with it.",
)
@click.option(
    "--array",
    "arrays",
    multiple=True,
    metavar="NAME=DIR",
    help="An array field NAME: a .npy per input in DIR, named as the input (a/b.jpg -> DIR/a/b.npy); repeatable.",
)
@click.option(
    "--image-column",
    default="image",
    show_default=True,
    help="Parquet: the image column ({bytes, path} or bytes).",
)
@click.option("--label-column", default="label", show_default=True, help="Parquet: the class column.")
@click.option(
    "--boxes-column",
    default="objects",
    show_default=True,
    help="Parquet: the boxes column, a struct of bbox and category lists (Hugging Face's objects).",
)
@click.option("--text-column", default=None, help="Parquet: a caption column, kept as the text field.")
@click.option(
    "--max-samples",
    type=click.IntRange(min=1),
    default=None,
    help="Parquet and tars: build from the first N samples only (in file order).",
)
@click.option(
    "--box-format",
    type=click.Choice(["xyxy", "xywh", "cxcywh"]),
    metavar="FORMAT",
    default="xyxy",
    show_default=True,
    help="Parquet and tar boxes: corners, COCO's x,y,w,h, or centre and size (in pixels).",
)
@click.option(
    "--flip-idx",
    default=None,
    metavar="I,J,...",
    help="Keypoints: the point each one becomes in a mirrored image (Ultralytics' flip_idx, e.g. "
    "0,2,1,4,3), recorded in the cache so a horizontal flip swaps left and right; any source with "
    "keypoints (replaces COCO's and data.yaml's).",
)
@click.option(
    "--keypoint-names",
    default=None,
    metavar="NAMES",
    help="Keypoints: the points' names, comma-separated, recorded in the cache; left_/right_ names pair "
    "up as flip_idx when --flip-idx is not given.",
)
@click.option(
    "--min-visibility",
    type=float,
    default=DEFAULT_MIN_VISIBILITY,
    show_default=True,
    help="Boxes keeping less of their area through the recipe (or a variant's crop) are dropped.",
)
@click.option(
    "--compression",
    default="none",
    show_default=True,
    help="hdf5: gzip or lzf (zstd, lz4 with hdf5plugin); zarr: zstd, lz4 or gzip; pt: none.",
)
@click.option(
    "--store",
    type=click.Choice(["pixels", "pixels-hwc", "jpeg", "png"]),
    metavar="STORE",
    default="pixels",
    show_default=True,
    help="pixels: decoded pixels, as planes; pixels-hwc: decoded pixels, channels-last (fastest for "
    "RandomResizedCrop-style crops at read time); jpeg or png: re-encoded (small caches; decoded on every read).",
)
@click.option("--quality", type=int, default=90, show_default=True, help="--store jpeg: JPEG quality.")
@click.option(
    "--fast-decode",
    is_flag=True,
    help="Decode large JPEGs at 1/2, 1/4 or 1/8 size when still >= the target (faster, not exact).",
)
@click.option(
    "--augment",
    type=int,
    default=0,
    show_default=True,
    help="Store K augmented variants per input (random-resized crop, flip, colour jitter).",
)
@click.option(
    "--order",
    type=click.Choice(["shuffled", "sorted"]),
    default="shuffled",
    show_default=True,
    help="shuffled: inputs spread over the shards by a seeded hash of their path (every shard mixes "
    "all classes); sorted: path order, contiguous shards.",
)
@click.option(
    "--shards",
    type=int,
    default=None,
    help="--order shuffled: number of shards [default: inputs / --shard-size at the first build; "
    "--update keeps it].",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the shuffled order and of --augment's random draws.",
)
@click.option(
    "--augment-rotate",
    type=float,
    default=0.0,
    show_default=True,
    help="--augment: rotate up to +-DEG degrees.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "dask"]),
    default="local",
    show_default=True,
    help="Where shard jobs run: local worker processes, or a dask.distributed cluster.",
)
@click.option(
    "--scheduler",
    default=None,
    help="--executor dask: address of an existing scheduler (tcp://HOST:8786) [default: a LocalCluster].",
)
@click.option(
    "--max-pixels",
    type=int,
    default=DEFAULT_MAX_PIXELS,
    show_default=True,
    help="Skip inputs larger than this (width x height, read from the header before decoding; "
    "also bounds the recipe's intermediate images); 0: no limit.",
)
@click.option(
    "--grace",
    type=str,
    default=None,
    help="How long shards of the cache version this build replaces stay for readers still using it: "
    f"seconds or 30m, 2h, 1d [default: {DEFAULT_GRACE_SECONDS // 3600}h; 0: remove them at the end].",
)
@click.option("--strict", is_flag=True, help="Exit 1 if any input had to be skipped.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the cache in --out (even one of other options); only files it recorded are removed.",
)
@click.option(
    "--update", is_flag=True, help="After RAW changed: rebuild only the shards whose inputs changed."
)
@click.option(
    "--split",
    default=None,
    metavar="NAME[,NAME...]",
    help="RAW names splits (data.yaml's train/val/test, train-*/test-* files, train/ val/ folders): build "
    "these only [default: every split, each a cache at --out/<split>].",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@with_storage_options
@friendly
def build_cmd(
    raw,
    out,
    fmt,
    pipeline,
    size,
    workers,
    shard_size,
    labels,
    annotations,
    masks,
    mask_classes,
    classes,
    arrays,
    image_column,
    label_column,
    boxes_column,
    text_column,
    max_samples,
    box_format,
    flip_idx,
    keypoint_names,
    min_visibility,
    compression,
    store,
    quality,
    fast_decode,
    augment,
    order,
    shards,
    seed,
    augment_rotate,
    executor,
    scheduler,
    max_pixels,
    grace,
    strict,
    overwrite,
    update,
    split,
    quiet,
    storage_option,
) -> None:
    """Decode + preprocess the images under RAW into a sharded cache at --out.

    RAW is an ImageFolder tree (RAW/<class>/**/<image>), a flat folder of images, or any folder
    with --labels; with --annotations (COCO, YOLO or VOC) the images come with their boxes, and with
    --masks with a class map each. RAW may also name Parquet files ('data/train-*.parquet', Hugging
    Face layout) or WebDataset tars ('shards/train-{000000..000099}.tar'); quote the pattern. Either may be a URL (s3://bucket/raw; --storage-option for its endpoint and
    credentials). Re-running the same command resumes an interrupted build.

    A RAW that names splits (a data.yaml's train/val/test, Hugging Face's train-*/test-* files,
    train/ and val/ folders) builds one cache per split, at --out/<split>.
    """
    from ..build.run import BuildConfig, SplitsResult, build
    from ..build.sources.sourceoptions import SourceOptions

    storage_options = options_of(storage_option, raw, out)
    config = BuildConfig(
        format=fmt,
        pipeline=pipeline,
        size=size,
        workers=workers,
        shard_size=shard_size,
        labels=labels,
        annotations=annotations,
        masks=masks,
        mask_classes=mask_classes,
        classes=classes,
        arrays=_arrays(arrays),
        min_visibility=min_visibility,
        strict=strict,
        overwrite=overwrite,
        update=update,
        fast_decode=fast_decode,
        augment=augment,
        seed=seed,
        augment_rotate=augment_rotate,
        compression=compression,
        store=store,
        quality=quality,
        order=order,
        shards=shards,
        max_pixels=max_pixels,
        grace=duration(grace, "--grace") if grace is not None else None,
        executor=executor,
        executor_options={"scheduler": scheduler} if scheduler else {},
        progress=not quiet,
        storage_options=storage_options,
        split=split,
        source=SourceOptions(
            box_format=box_format,
            image_column=image_column,
            label_column=label_column,
            boxes_column=boxes_column,
            text_column=text_column,
            max_samples=max_samples,
            flip_idx=flip_idx,
            keypoint_names=keypoint_names,
        ),
    )
    with warnings.catch_warnings(record=True) as caught:  # each a line of its own, as skips are
        warnings.simplefilter("always", UserWarning)
        result = build(raw, out, config)
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    if isinstance(result, SplitsResult):
        for name, one in result.results.items():
            _report(one, f"{name}: ")
    else:
        _report(result, "")
    click.echo(result.summary())


def _report(result, prefix: str) -> None:
    """What a build left out and kept, on stderr (``prefix``: the split's name)."""
    dropped = result.manifest.source.get("dropped_count", 0)
    if dropped:
        first = result.manifest.source["dropped"][:5]
        for d in first:
            click.echo(f"{prefix}annotation left out: {d['where']}: {d['reason']}", err=True)
        if dropped > len(first):
            click.echo(
                f"{prefix}... {dropped} annotations left out in all (cachekit info lists them)", err=True
            )
    for s in result.manifest.skipped[:10]:
        click.echo(f"{prefix}skipped {s.path}: {s.reason}", err=True)
    if len(result.manifest.skipped) > 10:
        click.echo(
            f"{prefix}... and {len(result.manifest.skipped) - 10} more skipped (see manifest.json)", err=True
        )
    if result.retired:
        click.echo(
            f"{prefix}kept {result.retired} shards of earlier versions for readers still using them; a later build "
            "removes them once their grace period is over (--grace)",
            err=True,
        )


def _arrays(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--array NAME=DIR`` options as a dict, refused in one line when malformed or repeated."""
    from ..errors import UsageError

    out = {}
    for pair in pairs:
        name, sep, folder = pair.partition("=")
        if not sep or not name or not folder:
            raise UsageError(f"--array takes NAME=DIR, got {pair!r}")
        if name in out:
            raise UsageError(f"--array {name} is given twice")
        out[name] = folder
    return out
