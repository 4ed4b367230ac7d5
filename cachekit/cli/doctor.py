"""``cachekit doctor``: is training waiting for data, where the time goes (``--plot``, ``--trace``), what to change."""

from __future__ import annotations

import click

from ..constants import DEFAULT_STEP_MS
from .app import EXIT_CODES, augment_spec, friendly, main, options_of, with_storage_options


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
@click.option(
    "--augment",
    "augment",
    default=None,
    callback=augment_spec,
    metavar="SPEC",
    help="The training run's transforms, such as 'RandomResizedCrop(224),RandomHorizontalFlip()' [default: none].",
)
@click.option("--prefetch-factor", type=int, default=2, show_default=True)
@click.option("--device", default=None, help="Device for --model [default: cuda if available, else cpu].")
@click.option(
    "--json", "json_out", type=click.Path(path_type=str), default=None, help="Write the figures here."
)
@click.option(
    "--plot",
    type=click.Path(path_type=str),
    default=None,
    help="Write a PNG here: each step's wait for data against its compute over time, GPU utilisation where "
    "measured, the verdict (needs matplotlib).",
)
@click.option(
    "--trace",
    type=click.Path(path_type=str),
    default=None,
    help="Write a Chrome trace here: the timed steps under torch.profiler with the loader's stages (reading, "
    "decoding, augmenting, batch ops, collate, the copy) as named ranges in every thread and worker process; "
    "prints the stage that costs the most.",
)
@click.option(
    "--split",
    default=None,
    metavar="NAME",
    help="CACHE is a folder of split caches: this split [default: train].",
)
@with_storage_options
@friendly
def doctor_cmd(
    cache,
    batch_size,
    steps,
    step_ms,
    step_kind,
    model,
    workers,
    augment,
    prefetch_factor,
    device,
    json_out,
    plot,
    trace,
    split,
    storage_option,
) -> None:
    """Is training waiting for data? Times the loader against a step, measures disk and CPU, says what to change.

    CACHE may be a URL (s3://...): its shards are then fetched into the node's local shard cache.
    """
    import json

    from ..store.splitdirs import choose_split
    from ..tools.benchview import check_outputs
    from ..tools.doctor import diagnose, load_model

    check_outputs(json_out, plot)  # what could fail after the run is checked before it starts
    options = options_of(storage_option, cache)
    cache, note = choose_split(cache, split)
    if note is not None:
        click.echo(note, err=True)
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
        augment=augment,
        trace=trace,
    )
    click.echo(report.summary())
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(report.to_json(), fh, indent=1)
    if plot:
        click.echo(f"picture:     {report.plot(plot)}")
