"""The ``cachekit`` command line: parses arguments, calls the library, prints. No logic of its own."""

from __future__ import annotations

import contextlib
import signal
import sys
from functools import wraps

import click

from .constants import (
    DEFAULT_FORMAT,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_PIPELINE,
    DEFAULT_STEP_MS,
    VERSION,
)
from .errors import CachekitError
from .image.recipes import builtin_pipelines

__all__ = ["main"]

#: The exit codes every command uses, shown at the end of ``--help``.
EXIT_CODES = """\b
Exit codes:
  0    ok
  1    a problem found in a cache or a build: a damaged shard or manifest,
       inputs skipped under --strict, a write that failed (disk full)
  2    usage: a bad option or argument, or a path that is not a cache
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)"""


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what Kubernetes, Slurm and ``kill`` send), unwound like Ctrl-C: workers stopped, lock released."""


@contextlib.contextmanager
def _sigterm_unwinds():
    """While a command runs, SIGTERM raises _Terminated in the main thread instead of killing it outright."""

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _friendly(fn):
    """Print a CachekitError as one line and exit with its code, instead of a traceback.

    Ctrl-C exits 130 and SIGTERM 143 (128 + the signal), each with one line, after the command
    has stopped its workers and released its lock.
    """

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with _sigterm_unwinds():
                return fn(*args, **kwargs)
        except CachekitError as exc:
            from .store.storageopts import redact_pairs

            click.echo(f"error: {redact_pairs(str(exc), kwargs.get('storage_option'))}", err=True)
            sys.exit(exc.exit_code)
        except _Terminated:
            click.echo("terminated (SIGTERM); re-run the same command to resume", err=True)
            sys.exit(128 + signal.SIGTERM)
        except KeyboardInterrupt:
            resumes = fn.__name__ in ("build_cmd", "convert_cmd")  # the others have nothing to resume
            click.echo("interrupted" + ("; re-run the same command to resume" if resumes else ""), err=True)
            sys.exit(130)

    return wrapper


def _storage_option(fn):
    """``--storage-option KEY=VALUE`` (repeatable) on a command that takes URLs."""
    return click.option(
        "--storage-option",
        "storage_option",
        multiple=True,
        metavar="KEY=VALUE",
        help="fsspec option for the URLs (s3://...) this command reaches, e.g. endpoint_url=http://HOST:9000, "
        "key=..., secret=..., anon=true, client_kwargs.region_name=eu-west-1 (dots nest); repeatable. "
        "Values true/false/numbers/JSON are typed. Never written into a cache nor shown.",
    )(fn)


def _storage_options(pairs: tuple[str, ...], *locations) -> dict:
    from .store.storageopts import options_for

    return options_for(pairs, *locations)


@click.group(epilog=EXIT_CODES)
@click.version_option(VERSION, prog_name="cachekit")
def main() -> None:
    """Decode and preprocess an image dataset once into a sharded cache; train from the cache."""


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
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_storage_option
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
    quiet,
    storage_option,
) -> None:
    """Decode + preprocess the images under RAW into a sharded cache at --out.

    RAW is an ImageFolder tree (RAW/<class>/**/<image>), a flat folder of images, or any folder
    with --labels. Either may be a URL (s3://bucket/raw; --storage-option for its endpoint and
    credentials). Re-running the same command resumes an interrupted build.
    """
    from .build.run import BuildConfig, build

    storage_options = _storage_options(storage_option, raw, out)
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
        order=order,
        shards=shards,
        max_pixels=max_pixels,
        grace=_duration(grace, "--grace") if grace is not None else None,
        executor=executor,
        executor_options={"scheduler": scheduler} if scheduler else {},
        progress=not quiet,
        storage_options=storage_options,
    )
    result = build(raw, out, config)
    for s in result.manifest.skipped[:10]:
        click.echo(f"skipped {s.path}: {s.reason}", err=True)
    if len(result.manifest.skipped) > 10:
        click.echo(f"... and {len(result.manifest.skipped) - 10} more skipped (see manifest.json)", err=True)
    if result.retired:
        click.echo(
            f"kept {result.retired} shards of earlier versions for readers still using them; a later build "
            "removes them once their grace period is over (--grace)",
            err=True,
        )
    click.echo(result.summary())


def _duration(text: str, flag: str) -> float:
    """Seconds from ``90``, ``30s``, ``30m``, ``2h`` or ``1d``."""
    from .errors import UsageError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip().lower()
    scale = units.get(value[-1:], None)
    try:
        seconds = float(value[:-1] if scale else value) * (scale or 1)
    except ValueError:
        raise UsageError(f"{flag}: expected seconds or a duration like 30m, 2h, 1d; got {text!r}") from None
    if seconds < 0 or seconds != seconds:
        raise UsageError(f"{flag} must be >= 0")
    return seconds


@main.command("info", epilog=EXIT_CODES)
@click.argument("cache", type=click.Path(path_type=str))
@_storage_option
@_friendly
def info_cmd(cache, storage_option) -> None:
    """Print a human summary of a cache's manifest (CACHE: a folder or a URL)."""
    from .store.location import read_manifest
    from .tools.report import describe

    options = _storage_options(storage_option, cache)
    click.echo(describe(read_manifest(cache, storage_options=options)))


@main.command("convert", epilog=EXIT_CODES)
@click.argument("cache", type=click.Path(path_type=str))
@click.option("--to", "to", required=True, help="Target format: pt, hdf5 or zarr.")
@click.option("--out", required=True, type=click.Path(path_type=str), help="Folder of the new cache.")
@click.option(
    "--compression", default="none", show_default=True, help="hdf5: gzip, lzf; zarr: zstd, lz4, gzip."
)
@click.option(
    "--overwrite", is_flag=True, help="Replace the cache in --out; only files it recorded are removed."
)
@click.option(
    "--grace",
    type=str,
    default=None,
    help="How long the replaced cache's shards stay for its readers (as for build) [default: 24h].",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_storage_option
@_friendly
def convert_cmd(cache, to, out, compression, overwrite, grace, quiet, storage_option) -> None:
    """Re-shard CACHE into another format or codec, without decoding the raw images again.

    CACHE and --out may be folders or URLs (s3://...). Re-running an interrupted conversion resumes it.
    """
    from .tools.convert import convert
    from .tools.report import human_bytes

    options = _storage_options(storage_option, cache, out)
    m = convert(
        cache,
        out,
        to,
        compression=compression,
        overwrite=overwrite,
        grace=_duration(grace, "--grace") if grace is not None else None,
        progress=not quiet,
        storage_options=options,
    )
    click.echo(
        f"converted: {m.num_samples} samples, {len(m.shards)} {m.format} shards, {human_bytes(m.total_bytes)} -> {out}"
    )


@main.command(
    "verify",
    epilog="""\b
Exit codes:
  0    every shard matches the manifest
  1    problems found: each bad shard is named (missing, truncated, changed,
       unreadable), or the manifest itself is damaged or of another format
       version (rebuild the cache)
  2    CACHE is not a cache: missing, not a folder, no manifest.json, or a
       manifest.json that is not cachekit's; or a bad option
  130  interrupted (Ctrl-C)""",
)
@click.argument("cache", type=click.Path(path_type=str))
@click.option("--quick", is_flag=True, help="Check sizes and shard headers only, not every byte's sha256.")
@_storage_option
@_friendly
def verify_cmd(cache, quick, storage_option) -> None:
    """Check every shard of CACHE (a folder or a URL) against its manifest, naming each bad shard."""
    from .tools.verify import verify

    options = _storage_options(storage_option, cache)
    report = verify(cache, quick=quick, storage_options=options)
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
    "--augment",
    is_flag=True,
    help="Every row does RandomResizedCrop + horizontal flip per sample, as its kind of user would "
    "(PIL as torchvision, OpenCV transform=, make_loader(augment=...)); variable-sized caches allowed.",
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
@click.option("--quiet", is_flag=True, help="No progress bars.")
@_storage_option
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
    augment,
    augment_size,
    json_out,
    plot,
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
    from .errors import UsageError
    from .store.storageopts import command_line
    from .tools.bench import BenchConfig, format_table, run_bench
    from .tools.benchsynthetic import bench_synthetic
    from .tools.benchview import check_outputs, write_outputs

    check_outputs(json_out, plot)  # what could fail after a long run is checked before it starts
    options = _storage_options(storage_option, *paths)

    config = BenchConfig(
        batch_size=batch_size,
        workers=workers,
        samples=samples,
        epochs=epochs,
        seed=seed,
        cold=not warm_only,
        raw_backends=tuple(b.strip() for b in raw_backends.split(",") if b.strip()),
        augment=augment,
        augment_size=augment_size,
    )

    def log(line: str) -> None:
        click.echo(line, err=True)

    if synthetic is not None:
        if paths:
            raise UsageError("--synthetic makes its own raw folder and caches; give no paths with it")
        result = bench_synthetic(
            synthetic, config, workdir=workdir, keep=workdir is not None, log=log, progress=not quiet
        )
    else:
        if len(paths) < 2:
            raise UsageError(
                "give a raw folder and at least one cache (cachekit bench RAW CACHE), or --synthetic N"
            )
        result = run_bench(paths[0], paths[1:], config, log=log, progress=not quiet, storage_options=options)
    result["command"] = command_line(sys.argv[1:])
    click.echo(format_table(result))
    for path in write_outputs(result, json_out, plot):
        log(f"written: {path}")


@main.command("doctor", epilog=EXIT_CODES)
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
@_storage_option
@_friendly
def doctor_cmd(
    cache,
    batch_size,
    steps,
    step_ms,
    step_kind,
    model,
    workers,
    prefetch_factor,
    device,
    json_out,
    storage_option,
) -> None:
    """Is training waiting for data? Times the loader against a step, measures disk and CPU, says what to change.

    CACHE may be a URL (s3://...): its shards are then fetched into the node's local shard cache.
    """
    import json

    from .tools.doctor import diagnose, load_model

    options = _storage_options(storage_option, cache)
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
        storage_options=options,
    )
    click.echo(report.summary())
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(report.to_json(), fh, indent=1)


@main.command("recipes", epilog=EXIT_CODES)
@click.argument("name", required=False)
@_friendly
def recipes_cmd(name) -> None:
    """List the built-in preprocessing recipes and the operations a recipe may use.

    With NAME, print that recipe's TOML: a starting point for your own (build --pipeline FILE.toml).
    """
    from .image.recipes import builtin_recipe_text
    from .tools.report import describe_recipes

    click.echo(builtin_recipe_text(name).rstrip("\n") if name else describe_recipes())


@main.command("env")
def env_cmd() -> None:
    """Print versions of cachekit and its dependencies, CPUs and GPUs: paste it into bug reports."""
    from .tools.report import environment

    click.echo(environment())


if __name__ == "__main__":  # pragma: no cover
    main()
