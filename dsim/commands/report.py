"""`dsim report`: the self-contained what-if HTML report of replay results.

Thin: options → ``find_result_runs`` → ``summarize_results`` → figures and page
(``dsim.render``) → one atomic write. plotly and pandas are imported inside
the command so that ``dsim --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsim.errors import OutputError, UsageError
from dsim.options import parse_epochs_option, parse_policy_option, select_runs

if TYPE_CHECKING:
    import pandas as pd

    from dsim.model.results import ResultRun
    from dsim.replay.policies import Policy

IMAGE_FORMATS = ("png", "svg")


def _display_names(runs: list[ResultRun]) -> dict[str, str]:
    """Run name per results directory, made unique when two directories hold the same run.

    A model variant is named by its directory (``RUN@pipeline``); the same name in
    two results directories gets the directory in brackets.
    """
    label = {
        str(r.directory): r.directory.name if r.directory.name != r.name else r.name for r in runs
    }
    counts: dict[str, int] = {}
    for name in label.values():
        counts[name] = counts.get(name, 0) + 1
    return {
        str(r.directory): name if counts[name] == 1 else f"{name} [{r.directory.parent}]"
        for r, name in ((r, label[str(r.directory)]) for r in runs)
    }


def _check_output(out: Path) -> None:
    """Fail before any work when the report could not be written there."""
    if out.is_dir():
        raise OutputError(f"cannot write {out}: it is a directory")
    parent = out.parent
    for ancestor in (parent, *parent.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise OutputError(f"cannot write {out}: {ancestor} is not a directory")
            break


def _timeline_replays(
    run: ResultRun, policies: list[Policy], summary_row: Any
) -> dict[Policy, pd.DataFrame]:
    """The timeline run's replays, restricted to the iterations the summary used."""
    from dsim.summary import selection_mask

    epochs = [int(e) for e in str(summary_row["selected_epochs"]).split(",") if e.strip()]
    warmup = int(summary_row["warmup"])
    out: dict[Policy, pd.DataFrame] = {}
    for policy in policies:
        table = run.read(policy)
        mask = selection_mask(
            table.column("epoch").to_numpy(), table.column("iteration").to_numpy(), epochs, warmup
        )
        frame = table.to_pandas()
        out[policy] = frame[mask].reset_index(drop=True)
    return out


def _selection_text(row: Any) -> str:
    epochs = str(row["selected_epochs"])
    label = "epoch" if "," not in epochs else "epochs"
    return f"{label} {epochs.replace(',', ', ')}, warm-up iterations ≤ {int(row['warmup'])} skipped"


def _write_images(figs: list[tuple[str, Any]], out: Path, fmt: str) -> Path | None:
    """Static copies of every figure, only when a renderer (kaleido) is installed."""
    try:
        import kaleido  # noqa: F401
        import plotly.io as pio
    except ImportError:
        typer.echo(
            f"dsim: note: no {fmt} images written: static export needs the kaleido package "
            "(pip install kaleido); the HTML report does not need it",
            err=True,
        )
        return None
    from dsim.io.atomic import atomic_path, remove_leftovers

    folder = out.with_name(f"{out.stem}_images")
    remove_leftovers(folder)
    for div_id, fig in figs:
        target = folder / f"{div_id.removeprefix('fig-')}.{fmt}"
        with atomic_path(target) as tmp:
            try:
                pio.write_image(fig, tmp, format=fmt, width=1200, scale=2 if fmt == "png" else 1)
            except (RuntimeError, ValueError) as exc:
                raise OutputError(f"cannot render {target}: {exc}") from exc
    return folder


def command(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Results directories written by `dsim run` (or single run directories).",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    run: Annotated[
        list[str] | None,
        typer.Option("--run", "-r", help="Only runs whose name matches this glob (repeatable)."),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy", "-p", help="Only this policy, FETCH/START such as avg/min (repeatable)."
        ),
    ] = None,
    timeline_run: Annotated[
        str | None,
        typer.Option(
            "--timeline-run",
            help="Runs (a glob) offered in the timeline and delay CDF, largest predicted gain "
            "first (default: every run, up to 6).",
        ),
    ] = None,
    epochs: Annotated[
        str | None,
        typer.Option(
            "--epochs",
            help="Epochs the statistics use: all, N, N,M or N-M (default: as `dsim run` recorded).",
        ),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(
            "--warmup", min=0, help="Skip iterations <= N of each epoch (default: recorded)."
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            min=0.0,
            help="Effective-delay threshold in seconds (default: recorded, else 0.030).",
        ),
    ] = None,
    images: Annotated[
        str | None,
        typer.Option(
            "--images",
            help="Also write each figure as png or svg next to the report (needs kaleido).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Accept a --threshold of 1 s or more (in seconds).")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")] = False,
) -> None:
    """Write a self-contained HTML what-if report (opens offline; plotly.js embedded)."""
    if images is not None and images.lower() not in IMAGE_FORMATS:
        raise UsageError(f"--images must be one of {', '.join(IMAGE_FORMATS)}, not {images!r}")
    from dsim.sanity import check_threshold

    check_threshold(threshold, force=force)
    epoch_sel = parse_epochs_option(epochs)
    policies = [parse_policy_option(p) for p in policy or []] or None
    _check_output(out)

    from dsim.io import lock
    from dsim.io.atomic import remove_leftovers, write_text
    from dsim.model.results import results_directories
    from dsim.render.html import render_report, report_figures

    def say(text: str) -> None:
        if not quiet:
            typer.echo(f"dsim: {text}", err=True)

    with lock.shared(results_directories(list(results)), say):  # read, then render unlocked
        data, notes = _read_results(
            results, run, policies, epoch_sel, warmup, threshold, timeline_run
        )
    for note in notes:
        say(f"note: {note}")
    figs = report_figures(data)
    remove_leftovers(out.parent)  # temporaries of a killed report
    write_text(render_report(data, figs), out)
    shown = list(dict.fromkeys(data.summary["run"]))
    size_mb = out.stat().st_size / 1e6
    if quiet:
        if images is not None:
            _write_images(figs, out, images.lower())
        return
    typer.echo(
        f"wrote {out} ({len(shown)} run{'s' if len(shown) != 1 else ''}, "
        f"{len(data.summary)} policy rows, {size_mb:.1f} MB)"
    )
    if images is not None:
        folder = _write_images(figs, out, images.lower())
        if folder is not None:
            typer.echo(f"wrote {len(figs)} {images.lower()} images to {folder}")


def _read_results(
    results: list[Path],
    run: list[str] | None,
    policies: list[Policy] | None,
    epoch_sel: Any,
    warmup: int | None,
    threshold: float | None,
    timeline_run: str | None,
) -> tuple[Any, list[str]]:
    """Everything the report shows, read from the results directories; and notes for the user."""
    from dsim.model.results import scan_results
    from dsim.render.html import ReportInput
    from dsim.replay.policies import BASELINE
    from dsim.summary import summarize_results

    scan = scan_results(list(results))
    runs = select_runs(scan.runs, run or [])
    for r in runs:
        if not r.replays:
            from dsim.errors import InputError

            raise InputError(
                "no replay tables listed in its result.json (re-run `dsim run` for this run)",
                r.directory,
            )
    if policies is not None:
        present = {p for r in runs for p in r.replays}
        missing = [p for p in policies if p not in present]
        if missing:
            listed = ", ".join(f"{f}/{s}" for f, s in missing)
            raise UsageError(f"--policy {listed}: no such replay in the selected runs")
    summary = summarize_results(
        runs, epochs=epoch_sel, warmup=warmup, threshold_s=threshold, policies=policies
    )
    names = _display_names(runs)
    summary["run"] = [
        names.get(d, r) for d, r in zip(summary["results"], summary["run"], strict=True)
    ]

    by_name = {names[str(r.directory)]: r for r in runs}
    _add_spread(summary, by_name)
    chosen = timeline_runs(summary, timeline_run)
    timelines = {}
    for name in chosen:
        rows = summary[summary["run"] == name]
        t_run = by_name[name]
        t_policies = [
            (str(f), str(s)) for f, s in zip(rows["fetch_align"], rows["start_align"], strict=True)
        ]
        if BASELINE in t_run.replays and BASELINE not in t_policies:
            t_policies.insert(0, BASELINE)
        timelines[name] = _timeline_replays(t_run, t_policies, rows.iloc[0])
    first_row = summary[summary["run"] == chosen[0]].iloc[0]
    data = ReportInput(
        summary=summary,
        timelines=timelines,
        threshold_s=float(first_row["threshold_s"]),
        selection=_selection_text(first_row),
        sources=[str(p) for p in results],
    )
    notes = scan.notes(runs)
    matching = len(_matching(summary, timeline_run))
    if matching > len(chosen):
        notes.append(
            f"timeline and CDF of {len(chosen)} of {matching} runs (the largest predicted gains); "
            "choose others with --timeline-run GLOB"
        )
    return data, notes


MAX_TIMELINE_RUNS = 6
"""Runs whose timeline and CDF the page carries: each adds up to a few MB."""


def predicted_gain(summary: pd.DataFrame) -> dict[str, float]:
    """Each run's largest predicted speed-up over its non-measured policies (NaN: none)."""
    from dsim.replay.policies import BASELINE

    out: dict[str, float] = {}
    for name, rows in summary.groupby("run", sort=False):
        other = rows[(rows["fetch_align"] != BASELINE[0]) | (rows["start_align"] != BASELINE[1])]
        values = other["speedup"].dropna()
        out[str(name)] = float(values.max()) if len(values) else float("nan")
    return out


def _matching(summary: pd.DataFrame, pattern: str | None) -> list[str]:
    from fnmatch import fnmatchcase

    shown = [str(n) for n in dict.fromkeys(summary["run"])]
    if pattern is None:
        return shown
    # a display name (RUN@pipeline, RUN [dir]) or the bare run name before the variant
    return [n for n in shown if fnmatchcase(n, pattern) or fnmatchcase(n.split("@")[0], pattern)]


def timeline_runs(summary: pd.DataFrame, pattern: str | None) -> list[str]:
    """Runs of the timeline and CDF switcher: those ``pattern`` (a glob) matches, largest
    predicted gain first (runs without one last, by name), at most ``MAX_TIMELINE_RUNS``."""
    matches = _matching(summary, pattern)
    if not matches:
        shown = ", ".join(str(n) for n in dict.fromkeys(summary["run"]))
        raise UsageError(f"--timeline-run {pattern}: matches none of the runs shown: {shown}")
    gain = predicted_gain(summary)

    def key(name: str) -> tuple[bool, float]:
        g = gain.get(name, float("nan"))
        return (g != g, -g if g == g else 0.0)

    return sorted(matches, key=key)[:MAX_TIMELINE_RUNS]


def _add_spread(summary: pd.DataFrame, by_name: dict[str, ResultRun]) -> None:
    """``<metric>_p10`` / ``_p90`` of iteration time and stall per row, from the replay
    tables over the iterations the summary used (the bars' whiskers)."""
    from dsim.render.figures.spread import quantile_spread
    from dsim.summary import selection_mask

    lows: dict[str, list[float]] = {"iteration_s": [], "stall_s": []}
    highs: dict[str, list[float]] = {"iteration_s": [], "stall_s": []}
    for _, row in summary.iterrows():
        table = by_name[str(row["run"])].read((str(row["fetch_align"]), str(row["start_align"])))
        epochs = [int(e) for e in str(row["selected_epochs"]).split(",") if e.strip()]
        mask = selection_mask(
            table.column("epoch").to_numpy(),
            table.column("iteration").to_numpy(),
            epochs,
            int(row["warmup"]),
        )
        for metric in lows:
            lo, hi = quantile_spread(table.column(metric).to_numpy()[mask])
            lows[metric].append(lo)
            highs[metric].append(hi)
    for metric in lows:
        summary[f"{metric}_p10"] = lows[metric]
        summary[f"{metric}_p90"] = highs[metric]
