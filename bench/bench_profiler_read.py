"""Which JSON reader for PyTorch profiler (Kineto) traces: speed and peak memory, side by side.

Usage::

    python bench/bench_profiler_read.py                  # a ~100 MB synthetic trace
    python bench/bench_profiler_read.py --mb 10 --repeats 1

dsim needs little of a trace: ``distributedInfo``, ``baseTimeNanoseconds``
and, from ``traceEvents``, the ``ProfilerStep#N`` and
``enumerate(DataLoader)#...__next__`` spans (a few per step among hundreds of
operator events). The synthetic trace copies the layout Kineto writes (one
key per line, ``args`` objects, metadata and flow events, ~170 events of
~250 bytes per step, as in the shipped real traces) so that every candidate
parses the same bytes. Each candidate runs in a fresh interpreter and
reports the seconds to get the spans and the peak RSS above the RSS after
imports. Candidates that are not installed are skipped, saying so.

- ``json``: the standard library, the whole document into Python objects;
- ``orjson``: the same, with orjson;
- ``ijson``: streaming, one event object at a time (``traceEvents.item``);
- ``pyarrow``: ``pyarrow.json.read_json`` of the document as one row (the
  reader wants newline-delimited JSON; a whole document fits only as one
  block as large as the file);
- ``dsim``: what ``dsim.sources.kineto.read_trace`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
STEP, LOADER = "ProfilerStep#", "enumerate(DataLoader)#"
OPS = ("aten::linear", "aten::addmm", "aten::relu", "aten::t", "aten::empty", "aten::copy_")


def _event(ph: str, cat: str, name: str, ts: float, dur: float | None, idx: int) -> str:
    dur_line = f'"dur": {dur:.3f},\n    ' if dur is not None else ""
    return (
        f'  {{\n    "ph": "{ph}", "cat": "{cat}", "name": "{name}", "pid": 4242, "tid": 4242,\n'
        f'    "ts": {ts:.3f}, {dur_line}\n    "args": {{\n      "External id": {idx},'
        f'"Record function id": 0, "Ev Idx": {idx}\n    }}\n  }}'
    )


def write_trace(path: Path, megabytes: float, rank: int = 0) -> int:
    """A Kineto-shaped trace of about ``megabytes``; returns its number of events."""
    ts, idx = 4587560332405.186, 0
    with open(path, "w") as out:
        out.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n'
            f'  "distributedInfo": {{"backend": "gloo", "rank": {rank}, "world_size": 4}},\n'
            '  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": 1790857026000000000,\n'
            '  "traceEvents": [\n'
        )
        step = 0
        first = True
        while out.tell() < megabytes * 1e6:
            events = [_event("X", "user_annotation", f"{STEP}{step}", ts, 12000.0, idx)]
            loader = f"{LOADER}_Iter.__next__"
            events.append(_event("X", "user_annotation", loader, ts + 50, 3e3, idx))
            t = ts + 3100
            for k in range(168):
                idx += 1
                if k % 40 == 39:
                    events.append(_event("f", "fwdbwd", "fwdbwd", t, None, idx))
                else:
                    events.append(_event("X", "cpu_op", OPS[k % len(OPS)], t, 40.0, idx))
                t += 50
            out.write(("" if first else ",\n") + ",\n".join(events))
            first = False
            idx += 1
            ts += 12000.0
            step += 1
        out.write('\n  ],\n  "traceName": "synthetic"\n}\n')
    return idx


def _spans(events) -> list[tuple[str, float, float]]:
    return [
        (e["name"], e["ts"], e["dur"])
        for e in events
        if e.get("ph") == "X" and e.get("name", "").startswith((STEP, LOADER))
    ]


def _read(kind: str, path: str) -> int:
    if kind == "json":
        with open(path, "rb") as handle:
            doc = json.load(handle)
        return len(_spans(doc["traceEvents"]))
    if kind == "orjson":
        import orjson

        doc = orjson.loads(Path(path).read_bytes())
        return len(_spans(doc["traceEvents"]))
    if kind == "ijson":
        import ijson

        with open(path, "rb") as handle:
            return len(_spans(ijson.items(handle, "traceEvents.item", use_float=True)))
    if kind == "pyarrow":
        import pyarrow.json as pj

        size = os.path.getsize(path)
        table = pj.read_json(path, read_options=pj.ReadOptions(block_size=size + 1))
        events = table.column("traceEvents")[0].values
        names = events.field("name").to_pylist()
        return sum(1 for n in names if n and n.startswith((STEP, LOADER)))
    if kind == "dsim":
        from dsim.sources.kineto import read_trace

        trace = read_trace(Path(path))
        return len(trace.steps["event"]) + len(trace.loader["event"])
    raise SystemExit(f"unknown reader {kind}")


def _child(kind: str, path: str) -> None:
    import resource

    modules = {"orjson": "orjson", "ijson": "ijson", "pyarrow": "pyarrow.json"}
    if kind in modules:
        __import__(modules[kind])
    if kind == "dsim":
        import dsim.sources.kineto  # noqa: F401
    base = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    started = time.perf_counter()
    spans = _read(kind, path)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "spans": spans, "peak_over_base": peak - base}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--readers", default="json,orjson,ijson,pyarrow,dsim")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dsim-bench")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    sys.path.insert(0, str(HERE.parent))
    import bench_parse

    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / f"synthetic_{args.mb:g}MB.pt.trace.json"
    if not path.exists():
        tmp = path.with_suffix(".part")
        write_trace(tmp, args.mb)
        tmp.rename(path)
    size = path.stat().st_size
    print(bench_parse._machine())
    print(
        f"trace {size / 1e6:.1f} MB; best of {args.repeats}; memory: peak RSS - RSS after imports"
    )
    print(f"{'reader':>8} {'s':>7} {'MB/s':>7} {'peak MB':>8} {'spans':>8}")
    for kind in [k.strip() for k in args.readers.split(",") if k.strip()]:
        runs = []
        for _ in range(args.repeats):
            done = subprocess.run(
                [sys.executable, str(HERE), "--child", kind, str(path)],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                print(f"{kind:>8} failed: {done.stderr.strip().splitlines()[-1]}", flush=True)
                break
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if runs:
            best = min(r["seconds"] for r in runs)
            peak = max(r["peak_over_base"] for r in runs)
            print(
                f"{kind:>8} {best:>7.2f} {size / 1e6 / best:>7.1f} {peak / 1e6:>8.0f}"
                f" {runs[0]['spans']:>8}",
                flush=True,
            )


if __name__ == "__main__":
    main()
