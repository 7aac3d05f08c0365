"""Raw logs of a synthetic DDP job whose loading is CPU work, with dsim.instrument's CPU fields.

Every rank runs one worker (prefetch 2) that builds batches back to back,
each ``fetch_s`` long of which ``cpu_s`` on a core and ``runq_s`` waiting for
one; the loop trains ``compute_s`` per batch. The timeline is the one a
stock DataLoader produces for these costs, so the pipeline model's identity
holds on it.
"""

from __future__ import annotations

from pathlib import Path

from dsim.instrument.lines import fetch_line, loader_line, training_line


def write_cpu_logs(
    directory: Path,
    *,
    ranks: int = 4,
    cores: int | None = 2,
    local_world_size: int | None = 4,
    iterations: int = 40,
    fetch_s: float = 0.050,
    cpu_s: float | None = 0.022,
    runq_s: float | None = 0.022,
    compute_s: float = 0.010,
    train_cpu_s: float | None = 0.002,
    proc_s: float | None = None,
    cpus: list[str] | None = None,
) -> Path:
    """One ``rank<N>.log`` per rank; ``cpu_s=None`` writes the same job without CPU fields.

    ``proc_s``: the worker process's CPU per batch (``proc``, SPEC §1.2), on every
    fetch line but the worker's first. ``cpus``: each rank's CPU set (the loader line's
    ``cpus``), by rank."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = dict(
        num_workers=1, prefetch_factor=2, batch_size=8, persistent_workers=0, pin_memory=0
    )
    if cores is not None:
        settings |= {"cores": cores, "local_world_size": local_world_size}
    origin = 1_700_000_000.0
    for rank in range(ranks):
        own = settings if cpus is None else {**settings, "cpus": cpus[rank]}
        lines = [loader_line(origin, rank, own)]
        end_prev = origin + 0.001  # the loop asks for batch 0
        fetch_end = origin + 0.001
        for i in range(iterations):
            fetch_end += fetch_s  # one worker, always busy: batches back to back
            fetch_end += 0.0002 * (rank % 2) * (i % 3 == 0)  # a little skew between ranks
            arrival = max(end_prev, fetch_end) + 0.0005
            end = arrival + compute_s
            cpu = None if cpu_s is None else cpu_s
            proc = None if cpu is None or not i else proc_s
            lines.append(fetch_line(fetch_end, rank, 0, fetch_s, i, cpu, runq_s, proc=proc))
            tcpu = None if cpu_s is None or train_cpu_s is None else (train_cpu_s, train_cpu_s)
            lines.append(
                training_line(
                    arrival, rank, 0, i, iterations, (end - end_prev, end - end_prev),
                    (arrival - end_prev, arrival - end_prev), None, tcpu, None,
                )
            )  # fmt: skip
            end_prev = end
        (directory / f"rank{rank}.log").write_text("".join(lines))
    return directory
