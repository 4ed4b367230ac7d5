"""``cachekit info``, ``convert`` and ``verify``: commands on an existing cache."""

from __future__ import annotations

import sys

import click

from .app import EXIT_CODES, duration, friendly, main, options_of, with_storage_options


@main.command("info", epilog=EXIT_CODES)
@click.argument("cache", type=click.Path(path_type=str))
@with_storage_options
@friendly
def info_cmd(cache, storage_option) -> None:
    """Print a human summary of a cache's manifest (CACHE: a folder or a URL, or a folder of split
    caches: each split's)."""
    from ..store.location import read_manifest
    from ..store.splitdirs import cache_splits, split_path
    from ..tools.report import describe

    options = options_of(storage_option, cache)
    splits = cache_splits(cache)
    if not splits:
        click.echo(describe(read_manifest(cache, storage_options=options)))
        return
    click.echo(f"{cache}: {len(splits)} splits, each a cache: {', '.join(splits)}")
    for name in splits:
        click.echo(f"\nsplit {name}:")
        click.echo(describe(read_manifest(split_path(cache, name))))


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
@with_storage_options
@friendly
def convert_cmd(cache, to, out, compression, overwrite, grace, quiet, storage_option) -> None:
    """Re-shard CACHE into another format or codec, without decoding the raw images again.

    CACHE and --out may be folders or URLs (s3://...). Re-running an interrupted conversion resumes it.
    """
    from ..tools.convert import convert
    from ..tools.report import human_bytes

    options = options_of(storage_option, cache, out)
    m = convert(
        cache,
        out,
        to,
        compression=compression,
        overwrite=overwrite,
        grace=duration(grace, "--grace") if grace is not None else None,
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
@with_storage_options
@friendly
def verify_cmd(cache, quick, storage_option) -> None:
    """Check every shard of CACHE (a folder or a URL, or each split of a folder of split caches)
    against its manifest, naming each bad shard."""
    from ..store.splitdirs import cache_splits, split_path
    from ..tools.verify import verify

    options = options_of(storage_option, cache)
    splits = cache_splits(cache)
    if not splits:
        report = verify(cache, quick=quick, storage_options=options)
        click.echo(report.summary(), err=not report.ok)
        if not report.ok:
            sys.exit(1)
        return
    bad = []
    for name in splits:
        report = verify(split_path(cache, name), quick=quick)
        click.echo(f"split {name}: {report.summary()}", err=not report.ok)
        if not report.ok:
            bad.append(name)
    if bad:
        click.echo(f"{cache}: problems in split {', '.join(bad)} of {', '.join(splits)}", err=True)
        sys.exit(1)
