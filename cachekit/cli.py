"""The ``cachekit`` command line: parses arguments, calls the library, prints. No logic of its own."""

from __future__ import annotations

import sys
from functools import wraps

import click

from .constants import DEFAULT_FORMAT, DEFAULT_PIPELINE, DEFAULT_STEP_MS, VERSION
from .errors import CachekitError

__all__ = ["main"]


def _friendly(fn):
    """Print a CachekitError as one line and exit with its code, instead of a traceback."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CachekitError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted; re-run the same command to resume", err=True)
            sys.exit(130)

    return wrapper


@click.group()
@click.version_option(VERSION, prog_name="cachekit")
def main() -> None:
    """Decode and preprocess an image dataset once into a sharded cache; train from the cache."""


@main.command("build")
@click.argument("raw", type=click.Path(path_type=str))
@click.option("--out", required=True, type=click.Path(path_type=str), help="Cache folder to write.")
@click.option(
    "--format", "fmt", default=DEFAULT_FORMAT, show_default=True, help="Shard format: pt, hdf5 or zarr."
)
@click.option(
    "--pipeline",
    default=DEFAULT_PIPELINE,
    show_default=True,
    help="Built-in recipe name (classification-224, letterbox-640) or a path to a .toml recipe.",
)
@click.option("--size", type=int, default=None, help="Override the recipe's output side in pixels.")
@click.option(
    "--workers", type=int, default=None, help="Worker processes [default: the CPUs this process may use]."
)
@click.option(
    "--shard-size",
    type=int,
    default=None,
    help="Samples per shard [default: ~128 MB of pixels, fewer for small datasets].",
)
@click.option(
    "--labels",
    type=click.Path(path_type=str),
    default=None,
    help="CSV of file,label (paths relative to RAW); only the files it lists are used.",
)
@click.option(
    "--compression",
    default="none",
    show_default=True,
    help="hdf5: gzip or lzf (zstd, lz4 with hdf5plugin); zarr: zstd, lz4 or gzip; pt: none.",
)
@click.option(
    "--store",
    type=click.Choice(["pixels", "jpeg", "png"]),
    default="pixels",
    show_default=True,
    help="Keep samples as decoded pixels, or re-encoded (small caches; decoded on every read).",
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
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --augment's random draws.")
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
@click.option("--strict", is_flag=True, help="Exit 1 if any input had to be skipped.")
@click.option("--overwrite", is_flag=True, help="Replace whatever cache --out holds.")
@click.option("--update", is_flag=True, help="Rebuild only the shards whose inputs changed.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_friendly
def build_cmd(
    raw,
    out,
    fmt,
    pipeline,
    size,
    workers,
    shard_size,
    labels,
    compression,
    store,
    quality,
    fast_decode,
    augment,
    seed,
    augment_rotate,
    executor,
    scheduler,
    strict,
    overwrite,
    update,
    quiet,
) -> None:
    """Decode + preprocess the images under RAW into a sharded cache at --out.

    RAW is an ImageFolder tree (RAW/<class>/**/<image>), a flat folder of images, or any folder
    with --labels. Re-running the same command resumes an interrupted build.
    """
    from .build.run import BuildConfig, build

    config = BuildConfig(
        format=fmt,
        pipeline=pipeline,
        size=size,
        workers=workers,
        shard_size=shard_size,
        labels=labels,
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
        executor=executor,
        executor_options={"scheduler": scheduler} if scheduler else {},
        progress=not quiet,
    )
    result = build(raw, out, config)
    for s in result.manifest.skipped[:10]:
        click.echo(f"skipped {s.path}: {s.reason}", err=True)
    if len(result.manifest.skipped) > 10:
        click.echo(f"... and {len(result.manifest.skipped) - 10} more skipped (see manifest.json)", err=True)
    click.echo(result.summary())


@main.command("info")
@click.argument("cache", type=click.Path(path_type=str))
@_friendly
def info_cmd(cache) -> None:
    """Print a human summary of a cache's manifest."""
    from .store.location import read_manifest
    from .tools.report import describe

    click.echo(describe(read_manifest(cache)))


@main.command("convert")
@click.argument("cache", type=click.Path(path_type=str))
@click.option("--to", "to", required=True, help="Target format: pt, hdf5 or zarr.")
@click.option("--out", required=True, type=click.Path(path_type=str), help="Folder of the new cache.")
@click.option(
    "--compression", default="none", show_default=True, help="hdf5: gzip, lzf; zarr: zstd, lz4, gzip."
)
@click.option("--overwrite", is_flag=True, help="Replace whatever --out holds.")
@_friendly
def convert_cmd(cache, to, out, compression, overwrite) -> None:
    """Re-shard CACHE into another format or codec, without decoding the raw images again."""
    from .tools.convert import convert
    from .tools.report import human_bytes

    m = convert(cache, out, to, compression=compression, overwrite=overwrite)
    click.echo(
        f"converted: {m.num_samples} samples, {len(m.shards)} {m.format} shards, {human_bytes(m.total_bytes)} -> {out}"
    )


@main.command("verify")
@click.argument("cache", type=click.Path(path_type=str))
@click.option("--quick", is_flag=True, help="Check sizes and shard headers only, not every byte's sha256.")
@_friendly
def verify_cmd(cache, quick) -> None:
    """Check every shard of CACHE against its manifest; exit 1 naming each bad shard."""
    from .tools.verify import verify

    report = verify(cache, quick=quick)
    click.echo(report.summary(), err=not report.ok)
    if not report.ok:
        sys.exit(1)


def _int_list(ctx, param, value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or min(out) < 0:
        raise click.BadParameter("expected at least one worker count >= 0")
    return out


@main.command("bench")
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option(
    "--synthetic", type=int, default=None, help="Generate N ImageNet-like JPEGs, build caches, compare."
)
@click.option(
    "--workdir", type=click.Path(path_type=str), default=None, help="--synthetic: where to keep its files."
)
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option("--workers", default="0,2", show_default=True, callback=_int_list, help="Worker counts to try.")
@click.option("--samples", type=int, default=None, help="Samples per epoch [default: all].")
@click.option("--epochs", type=int, default=2, show_default=True, help="Epoch 1 is cold; the rest are warm.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--warm-only", is_flag=True, help="Do not drop the files from the page cache before epoch 1.")
@click.option(
    "--raw-backends", default="pil,opencv", show_default=True, help="Raw loaders to run: pil, opencv."
)
@click.option(
    "--json", "json_out", type=click.Path(path_type=str), default=None, help="Write every figure here."
)
@click.option("--plot", type=click.Path(path_type=str), default=None, help="Write a PNG bar chart here.")
@_friendly
def bench_cmd(
    paths,
    synthetic,
    workdir,
    batch_size,
    workers,
    samples,
    epochs,
    seed,
    warm_only,
    raw_backends,
    json_out,
    plot,
) -> None:
    """Load speed of RAW (PIL and OpenCV) and each CACHE, side by side: cachekit bench RAW CACHE [CACHE ...]

    With --synthetic N no paths are needed: it writes N JPEGs, builds pt, hdf5 and zarr caches and compares.
    """
    import json

    from .errors import UsageError
    from .tools.bench import BenchConfig, bench_synthetic, format_table, plot_result, run_bench

    config = BenchConfig(
        batch_size=batch_size,
        workers=workers,
        samples=samples,
        epochs=epochs,
        seed=seed,
        cold=not warm_only,
        raw_backends=tuple(b.strip() for b in raw_backends.split(",") if b.strip()),
    )

    def log(line: str) -> None:
        click.echo(line, err=True)

    if synthetic is not None:
        if paths:
            raise UsageError("--synthetic makes its own raw folder and caches; give no paths with it")
        result = bench_synthetic(synthetic, config, workdir=workdir, keep=workdir is not None, log=log)
    else:
        if len(paths) < 2:
            raise UsageError(
                "give a raw folder and at least one cache (cachekit bench RAW CACHE), or --synthetic N"
            )
        result = run_bench(paths[0], paths[1:], config, log=log)
    result["command"] = "cachekit " + " ".join(sys.argv[1:])
    click.echo(format_table(result))
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(result, fh, indent=1)
    if plot:
        plot_result(result, plot)


@main.command("doctor")
@click.argument("cache", type=click.Path(path_type=str))
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option("--steps", type=int, default=50, show_default=True, help="Steps timed (after 2 warm-up steps).")
@click.option(
    "--step-ms",
    type=float,
    default=None,
    help=f"Simulate a training step of this many milliseconds [default: {DEFAULT_STEP_MS:g} without --model].",
)
@click.option(
    "--step-kind",
    type=click.Choice(["busy", "sleep"]),
    default="busy",
    show_default=True,
    help="Simulated step: busy holds the GIL like a Python-heavy step; sleep releases it like a step "
    "waiting on the GPU.",
)
@click.option(
    "--model",
    default=None,
    help="MODULE:FUNCTION building a torch model to train instead (MODULE may be in the current folder).",
)
@click.option("--workers", type=int, default=None, help="Loader workers [default: make_loader's choice].")
@click.option("--prefetch-factor", type=int, default=2, show_default=True)
@click.option("--device", default=None, help="Device for --model [default: cuda if available, else cpu].")
@click.option(
    "--json", "json_out", type=click.Path(path_type=str), default=None, help="Write the figures here."
)
@_friendly
def doctor_cmd(
    cache, batch_size, steps, step_ms, step_kind, model, workers, prefetch_factor, device, json_out
) -> None:
    """Is training waiting for data? Times the loader against a step, measures disk and CPU, says what to change."""
    import json

    from .tools.doctor import diagnose, load_model

    report = diagnose(
        cache,
        batch_size=batch_size,
        steps=steps,
        step_ms=step_ms,
        step_kind=step_kind,
        model=load_model(model) if model else None,
        workers=workers,
        prefetch_factor=prefetch_factor,
        device=device,
    )
    click.echo(report.summary())
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(report.to_json(), fh, indent=1)


@main.command("env")
def env_cmd() -> None:
    """Print versions of cachekit and its dependencies, CPUs and GPUs: paste it into bug reports."""
    from .tools.report import environment

    click.echo(environment())


if __name__ == "__main__":  # pragma: no cover
    main()
