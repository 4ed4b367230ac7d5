"""``cachekit bench``, ``preview``, ``recipes`` and ``env``: measuring and describing (``doctor``: its own module)."""

from __future__ import annotations

import sys

import click

from .app import EXIT_CODES, augment_spec, friendly, main, options_of, with_storage_options


def _int_list(ctx, param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or min(out) < 0:
        raise click.BadParameter("expected at least one worker count >= 0")
    return out


@main.command("bench", epilog=EXIT_CODES)
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option(
    "--synthetic",
    type=int,
    default=None,
    help="Generate N ImageNet-like JPEGs, build pt, hdf5 and zarr caches (train-256 with --augment), compare.",
)
@click.option(
    "--workdir", type=click.Path(path_type=str), default=None, help="--synthetic: where to keep its files."
)
@click.option(
    "--boxes",
    is_flag=True,
    help="--synthetic: images with objects and YOLO labels, built into detection caches (letterbox-640 + boxes).",
)
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option(
    "--workers",
    default=None,
    callback=_int_list,
    help="Worker counts to try, such as 0,2 [default: 0,2, leaving out those /dev/shm cannot serve].",
)
@click.option("--samples", type=int, default=None, help="Samples per epoch [default: all].")
@click.option(
    "--repeats",
    type=int,
    default=None,
    help="Warm epochs timed per row after its first (cold) one; each row shows their median and "
    "min-max [default: 3].",
)
@click.option(
    "--epochs",
    type=int,
    default=None,
    help="Epochs in all instead of --repeats: epoch 1 is cold, the rest warm.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--warm-only", is_flag=True, help="Do not drop the files from the page cache before epoch 1.")
@click.option(
    "--raw-backends", default="pil,opencv", show_default=True, help="Raw loaders to run: pil, opencv."
)
@click.option(
    "--augment",
    "augment",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[SPEC]",
    help="Alone: every row does RandomResizedCrop + horizontal flip per sample, as its kind of user would "
    "(PIL as torchvision, OpenCV transform=, make_loader(augment=...)); variable-sized caches allowed. "
    "With SPEC ('RandomResizedCrop(224),RandomHorizontalFlip(),ColorJitter(0.4)', any of "
    "cachekit.transforms): the make_loader rows run SPEC, the others are left out. Put it after the paths.",
)
@click.option(
    "--augment-size",
    type=int,
    default=None,
    help="--augment: crop side [default: the caches' sample size, 224 for variable-sized caches].",
)
@click.option(
    "--json", "json_out", type=click.Path(path_type=str), default=None, help="Write every figure here."
)
@click.option(
    "--plot",
    type=click.Path(path_type=str),
    default=None,
    help="Write a PNG chart here: speed-up over the best raw loader (needs matplotlib).",
)
@click.option(
    "--split",
    default=None,
    metavar="NAME",
    help="A CACHE that is a folder of split caches: bench this split (and RAW's inputs of it) "
    "[default: train].",
)
@click.option("--quiet", is_flag=True, help="No progress bars.")
@with_storage_options
@friendly
def bench_cmd(
    paths,
    synthetic,
    workdir,
    boxes,
    batch_size,
    workers,
    samples,
    repeats,
    epochs,
    seed,
    warm_only,
    raw_backends,
    augment,
    augment_size,
    json_out,
    plot,
    split,
    quiet,
    storage_option,
) -> None:
    """Load speed of RAW (PIL and OpenCV) and each CACHE, side by side: cachekit bench RAW CACHE [CACHE ...]

    A CACHE may be a URL (s3://...; --storage-option for its endpoint and credentials): its rows
    then include fetching shards into the node's local shard cache.

    RAW's files that a build would skip (empty, truncated, undecodable, unreadable) are left out of
    every row and counted; every row reads the same samples. With --synthetic N no paths are
    needed: it writes N JPEGs, builds pt, hdf5 and zarr caches and compares. With --augment every
    row also crops and flips each sample at random (the training workload); caches whose samples
    vary in size (--pipeline train-256) are then welcome.
    """
    import os

    from ..errors import UsageError
    from ..store.storageopts import command_line
    from ..tools.bench import BenchConfig, format_table, run_bench
    from ..tools.benchsynthetic import bench_synthetic
    from ..tools.benchview import check_outputs, write_outputs

    check_outputs(json_out, plot)  # what could fail after a long run is checked before it starts
    options = options_of(storage_option, *paths)
    spec = augment or None
    if spec is not None and os.path.exists(spec):
        raise UsageError(f"--augment took the path {spec!r} as its SPEC: put the paths before --augment")

    config = BenchConfig(
        batch_size=batch_size,
        workers=workers,
        samples=samples,
        epochs=epochs,
        repeats=repeats,
        seed=seed,
        cold=not warm_only,
        raw_backends=tuple(b.strip() for b in raw_backends.split(",") if b.strip()),
        augment=augment is not None,
        augment_size=augment_size,
        augment_spec=spec,
    )

    def log(line: str) -> None:
        click.echo(line, err=True)

    if synthetic is not None:
        if split is not None:
            raise UsageError("--split picks a split of a CACHE given; --synthetic builds its own caches")
        if paths:
            raise UsageError("--synthetic makes its own raw folder and caches; give no paths with it")
        result = bench_synthetic(
            synthetic,
            config,
            workdir=workdir,
            keep=workdir is not None,
            log=log,
            progress=not quiet,
            boxes=boxes,
        )
    else:
        if boxes:
            raise UsageError("--boxes goes with --synthetic N")
        if len(paths) < 2:
            raise UsageError(
                "give a raw folder and at least one cache (cachekit bench RAW CACHE), or --synthetic N"
            )
        result = run_bench(
            paths[0], paths[1:], config, log=log, progress=not quiet, storage_options=options, split=split
        )
    result["command"] = command_line(sys.argv[1:])
    click.echo(format_table(result))
    for path in write_outputs(result, json_out, plot):
        log(f"written: {path}")


@main.command("preview", epilog=EXIT_CODES)
@click.argument("cache", type=click.Path(path_type=str))
@click.option(
    "--augment",
    "augment",
    default=None,
    callback=augment_spec,
    metavar="SPEC",
    help="Transforms of cachekit.transforms, such as 'RandomResizedCrop(224),RandomHorizontalFlip()' "
    "[default: none, the samples as stored].",
)
@click.option(
    "--out", default="grid.png", show_default=True, type=click.Path(path_type=str), help="PNG to write."
)
@click.option("-n", "--samples", "n", type=int, default=16, show_default=True, help="Samples drawn.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the order and the draws.")
@click.option("--epoch", type=int, default=0, show_default=True, help="Epoch whose draws are shown.")
@click.option("--cell", type=int, default=256, show_default=True, help="Pixels of each image's longer side.")
@click.option("--columns", type=int, default=None, help="Images per row [default: a square grid].")
@click.option(
    "--min-visibility",
    type=float,
    default=None,
    help="Drop a box keeping less of its area, as make_loader(min_visibility=) does [default: make_loader's].",
)
@click.option("--split", default=None, metavar="NAME", help="CACHE is a folder of split caches: draw this split.")
@with_storage_options
@friendly
def preview_cmd(cache, augment, out, n, seed, epoch, cell, columns, min_visibility, split, storage_option) -> None:
    """Draw augmented samples of CACHE as training sees them: boxes with class names, masks, labels, captions.

    The samples are the first batch of --epoch in the order of --seed, read by make_loader with
    --augment (a list of transforms by name with literal arguments; nothing in it is run as code).
    """
    from ..errors import UsageError
    from ..feed.dataset import CachedDataset
    from ..store.splitdirs import choose_split
    from ..tools.preview import preview

    options = options_of(storage_option, cache)
    cache, _ = choose_split(cache, split, default=None)  # which split is shown is the user's to say
    dataset = CachedDataset(cache, storage_options=options)
    try:
        result = preview(
            dataset,
            augment,
            n=n,
            out=out,
            seed=seed,
            epoch=epoch,
            cell=cell,
            columns=columns,
            min_visibility=min_visibility,
        )
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    finally:
        dataset.close()
    click.echo(f"written: {result.path} ({len(result.cells)} samples, {result.title})")


@main.command("recipes", epilog=EXIT_CODES)
@click.argument("name", required=False)
@friendly
def recipes_cmd(name) -> None:
    """List the built-in preprocessing recipes and the operations a recipe may use.

    With NAME, print that recipe's TOML: a starting point for your own (build --pipeline FILE.toml).
    """
    from ..image.recipes import builtin_recipe_text
    from ..tools.report import describe_recipes

    click.echo(builtin_recipe_text(name).rstrip("\n") if name else describe_recipes())


@main.command("env")
def env_cmd() -> None:
    """Print versions of cachekit and its dependencies, CPUs and GPUs: paste it into bug reports."""
    from ..tools.report import environment

    click.echo(environment())
