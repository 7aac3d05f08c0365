"""`dsim synth`: write deterministic synthetic raw logs from a queueing model (``dsim.synth``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dsim.words import counted


def command(
    gpus: Annotated[int, typer.Option("--gpus", help="Number of GPUs (ranks).")],
    iterations: Annotated[int, typer.Option("--iterations", help="Iterations per epoch.")],
    epochs: Annotated[int, typer.Option("--epochs", help="Number of epochs.")],
    workers: Annotated[int, typer.Option("--workers", help="DataLoader workers per GPU.")],
    out: Annotated[Path, typer.Option("--out", help="Directory that receives <name>/.")],
    prefetch: Annotated[int, typer.Option("--prefetch", help="Batches in flight per worker.")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Random seed; same seed, same bytes.")] = 0,
    fetch_mean: Annotated[
        float, typer.Option("--fetch-mean", help="Mean seconds for one worker to build one batch.")
    ] = 1.0,
    fetch_cv: Annotated[
        float,
        typer.Option("--fetch-cv", help="Coefficient of variation of fetch times (lognormal)."),
    ] = 0.2,
    skew: Annotated[
        float,
        typer.Option(
            "--skew", help="The last GPU's fetches are (1 + skew) times slower than GPU 0's."
        ),
    ] = 0.0,
    straggler_prob: Annotated[
        float, typer.Option("--straggler-prob", help="Probability that a fetch is a straggler.")
    ] = 0.01,
    straggler_factor: Annotated[
        float,
        typer.Option("--straggler-factor", help="How many times slower a straggler fetch is."),
    ] = 4.0,
    compute: Annotated[
        float, typer.Option("--compute", help="Seconds of compute per iteration.")
    ] = 0.25,
    allreduce: Annotated[
        float,
        typer.Option("--allreduce", help="Seconds of the all-reduce that ends each iteration."),
    ] = 0.02,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Samples per GPU and iteration.")
    ] = 256,
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="Run name (default: synth_queue_seed<S>_gpus<G>_epoch<E>_...)."
        ),
    ] = None,
    per_rank: Annotated[
        bool,
        typer.Option("--per-rank", help="Write rank<N>.log per GPU instead of one output.log."),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success.")] = False,
) -> None:
    """Write synthetic raw DDP logs (format: `dsim help spec 1`) from a queueing model.

    Same parameters and seed give byte-identical logs. Example:

      dsim synth --gpus 4 --iterations 500 --epochs 2 --workers 4 --out logs/
    """
    from dsim.synth import SynthParams, check_output, synthesize

    params = SynthParams(
        gpus=gpus,
        iterations=iterations,
        epochs=epochs,
        workers=workers,
        prefetch=prefetch,
        seed=seed,
        fetch_mean_s=fetch_mean,
        fetch_cv=fetch_cv,
        skew=skew,
        straggler_prob=straggler_prob,
        straggler_factor=straggler_factor,
        compute_s=compute,
        allreduce_s=allreduce,
        batch_size=batch_size,
        name=name,
        per_rank=per_rank,
    )
    check_output(params, out)
    if quiet or not sys.stderr.isatty():
        path = synthesize(params, out)
    else:
        from rich.progress import Progress

        from dsim.synth.writer import estimated_bytes
        from dsim.words import byte_size

        with Progress(transient=True) as bar:
            size = byte_size(estimated_bytes(params))
            task = bar.add_task(f"synthesizing ~{size}", total=params.iterations * params.epochs)
            path = synthesize(
                params, out, progress=lambda done, total: bar.update(task, completed=done)
            )
    if not quiet:
        typer.echo(f"wrote {path} ({counted(params.lines, 'line', sep=',')})")
