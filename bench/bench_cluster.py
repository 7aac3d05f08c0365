"""`dsim run` of one sweep side by side: in-process, embedded Ray, and Ray clusters of 1, 2
and 4 nodes of 1 CPU each in a loopback-only network namespace (issue #21 item 2).

Why: on Ray each run is one task (read, replay, write on the node that runs
it); this measures whether that spreads the work: the cluster speed-up of
2 and 4 nodes over 1 node (targets >= 1.7x and >= 3x on a 100-run sweep),
and in-process against Ray on one machine (what ``--executor auto`` decides).

Runs come from ``dsim.synth`` (cached under ``--work``, as ``bench_e2e.py``
does), are parsed once, and every ``dsim run`` writes a fresh results
directory (nothing reused). Only ``dsim run`` is timed (wall clock); starting
a cluster (``ray start`` in the namespace, waiting for its nodes) is not, and
is reported beside it. Every case's files are compared byte for byte with the
in-process ones (``identical``).

A cluster's nodes are ``ray start`` processes inside a fresh network
namespace that has only its own loopback (``ip netns``; needs root), so
nothing can reach them from outside; each is stopped by its pid (never
``ray stop``) and the namespace is deleted. Without ``ip netns`` the cluster
cases are skipped with a note. All nodes run on this machine: give it at
least as many free cores as the largest cluster has nodes (plus one for the
driver), or the speed-up measures the machine, not dsim.

Usage (repository root)::

    python bench/bench_cluster.py                           # 100 runs of 10,000 x 8
    python bench/bench_cluster.py --runs 100 --nodes 1 2 4 --out bench/out/cluster.json
    python bench/bench_cluster.py --quick                   # 4 runs of 200 x 2: checks it works
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import cached_pool, child_env, dsim_command, run_name, tree_of

RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6391  # inside a private namespace: no other process can hold it


def timed_run(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of one ``dsim run``; a failure stops the benchmark with its output."""
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stderr}")
    return wall


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- clusters


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def namespace() -> Iterator[str | None]:
    """A fresh loopback-only network namespace, or None where that is not permitted."""
    if shutil.which("ip") is None:
        yield None
        return
    name = f"dsimb-{uuid.uuid4().hex[:8]}"
    if _ip("netns", "add", name).returncode != 0:
        yield None
        return
    try:
        if _ip("netns", "exec", name, "ip", "link", "set", "lo", "up").returncode != 0:
            yield None
            return
        yield name
    finally:
        _ip("netns", "del", name)


TOKEN = secrets.token_hex(32)


def ray_env() -> dict[str, str]:
    """Nodes' and clients' environment: no inherited Ray address or loopback switch, and
    one fresh token (Ray's token authentication on, as the multi-node test runs it)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "DSIM_DEBUG"):
        env.pop(name, None)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    import psutil

    family: list[Any] = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            parent = psutil.Process(proc.pid)
            family.extend([parent, *parent.children(recursive=True)])
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(family, timeout=15)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)


def _alive_nodes(ns: str, env: dict[str, str]) -> int:
    probe = (
        "import logging, ray; "
        f"ray.init(address='127.0.0.1:{PORT}', logging_level=logging.ERROR, log_to_driver=False); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


@contextlib.contextmanager
def cluster(ns: str, nodes: int, logs: Path) -> Iterator[float]:
    """``nodes`` Ray nodes of 1 CPU in ``ns``; yields the seconds it took to have them all."""
    env = ray_env()
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--block", "--disable-usage-stats"]
    head = [RAY, "start", "--head", f"--port={PORT}", "--include-dashboard=false", *common]
    worker = [RAY, "start", f"--address=127.0.0.1:{PORT}", *common]
    procs: list[subprocess.Popen] = []
    started = time.perf_counter()
    try:
        for k in range(nodes):
            with (logs / f"node{k}.log").open("w") as out:
                procs.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", ns, *(head if k == 0 else worker)],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            if k == 0:
                _wait(ns, env, 1)
        _wait(ns, env, nodes)
        yield time.perf_counter() - started
    finally:
        _stop(procs)


def _wait(ns: str, env: dict[str, str], count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _alive_nodes(ns, env) >= count:
            return
        time.sleep(1)
    raise SystemExit(f"the cluster did not reach {count} nodes in {timeout_s:.0f} s")


# --------------------------------------------------------------------------- cases


def measure(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    pool = cached_pool(work, args.gpus, args.iterations, 1, args.runs)
    tree = tree_of(pool, args.runs)
    scratch = Path(tempfile.mkdtemp(prefix="dsim-bench-cluster-", dir=work))
    dsim = dsim_command()
    env = child_env(None)
    traces = scratch / "traces"
    subprocess.run([*dsim, "parse", str(tree), "--out", str(traces), "-q"], env=env, check=True)
    names = [run_name(i) for i in range(args.runs)]
    base = [*dsim, "run", *names, "--traces", str(traces), "--quiet"]
    rows: list[dict[str, Any]] = []
    reference: dict[str, bytes] | None = None

    def case(label: str, extra: list[str], case_env: dict[str, str], wrap: list[str]) -> None:
        nonlocal reference
        for repeat in range(args.repeats):
            out = scratch / "out"  # one name: the summary's `results` column holds it
            wall = timed_run([*wrap, *base, "--out", out.name, *extra], case_env, scratch)
            files = tree_bytes(out)
            shutil.rmtree(out)
            if reference is None:
                reference = files
            rows.append(
                {"case": label, "repeat": repeat, "run_s": wall, "identical": files == reference}
            )
            print(f"{label:>16} repeat {repeat}: {wall:7.2f} s", flush=True)

    case("in-process", ["--executor", "local"], env, [])
    case("ray embedded", ["--executor", "ray"], env, [])
    cluster_starts: dict[int, float] = {}
    with namespace() as ns:
        if ns is None:
            print("no `ip netns` here (root needed): cluster cases skipped", flush=True)
        else:
            for nodes in args.nodes:
                logs = scratch / f"logs{nodes}"
                logs.mkdir()
                with cluster(ns, nodes, logs) as start_s:
                    cluster_starts[nodes] = start_s
                    address = ["--executor", "ray", "--ray-address", f"127.0.0.1:{PORT}"]
                    case(
                        f"{nodes} node(s) x 1 CPU", address, ray_env(), ["ip", "netns", "exec", ns]
                    )
    shutil.rmtree(scratch, ignore_errors=True)
    return {"rows": rows, "cluster_start_s": cluster_starts}


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    best: dict[str, float] = {}
    for row in result["rows"]:
        best[row["case"]] = min(best.get(row["case"], float("inf")), row["run_s"])
    print(
        f"\n{args.runs} runs of {args.iterations} x {args.gpus}, 9 policies; best of {args.repeats}"
    )
    local = best.get("in-process")
    one = best.get("1 node(s) x 1 CPU")
    for label, seconds in best.items():
        vs_local = f"{local / seconds:5.2f}x vs in-process" if local else ""
        vs_one = f"{one / seconds:5.2f}x vs 1 node" if one and "node" in label else ""
        print(f"  {label:>18}: {seconds:7.2f} s  {vs_local}  {vs_one}")
    if not all(row["identical"] for row in result["rows"]):
        print(
            "  NOT byte-identical to in-process:", [r for r in result["rows"] if not r["identical"]]
        )
    else:
        print("  every case's files byte-identical to in-process")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "dsim-bench"))
    parser.add_argument("--out", help="write the measurements as JSON here")
    parser.add_argument("--quick", action="store_true", help="4 runs of 200 x 2, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.iterations, args.gpus, args.repeats = 4, 200, 2, 1
    result = measure(args)
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    result["args"] = {k: v for k, v in vars(args).items() if k != "out"}
    report(result, args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
