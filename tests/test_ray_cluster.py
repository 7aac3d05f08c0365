"""`dsim run` on a real two-node Ray cluster, isolated in a loopback-only network namespace.

The cluster keeps Ray's token authentication on: the nodes and the dsim
client share a fresh token through ``RAY_AUTH_TOKEN``. Every process this
test starts is stopped by its pid (never ``ray stop``, which would also stop
other people's Ray), and the namespace is deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim
from tracegen import write_synthetic

pytestmark = pytest.mark.ray

RUN = "cluster_run"
PORT = 6390  # the namespace is private, so no other process can hold it
RAY = str(Path(sys.executable).with_name("ray"))


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[str]:
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed")
    name = f"dsim-{uuid.uuid4().hex[:8]}"
    added = _ip("netns", "add", name)
    if added.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {added.stderr.strip()}")
    try:
        up = _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        if up.returncode != 0:
            pytest.skip(f"cannot bring up loopback in a namespace: {up.stderr.strip()}")
        yield name
    finally:
        _ip("netns", "del", name)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the processes we started and everything they spawned, by pid."""
    family: list[psutil.Process] = []
    for proc in procs:
        try:
            parent = psutil.Process(proc.pid)
            family.extend([parent, *parent.children(recursive=True)])
        except psutil.NoSuchProcess:
            continue
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(family, timeout=15)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=10)
    for proc in procs:
        proc.wait(timeout=10)


def _wait_for_nodes(ns: str, env: dict[str, str], count: int, timeout_s: float = 90) -> None:
    probe = (
        "import logging, ray; "
        f"ray.init(address='127.0.0.1:{PORT}', logging_level=logging.ERROR, log_to_driver=False); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", probe],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        last = (proc.stdout + proc.stderr).strip()
        if proc.returncode == 0 and proc.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1)
    raise AssertionError(f"the cluster did not reach {count} nodes: {last[-2000:]}")


def test_run_on_two_node_cluster_matches_local(netns: str, tmp_path: Path) -> None:
    write_synthetic(tmp_path / "traces", RUN, iterations=25)
    conf = {"FILE": RUN, "FETCH_ALIGN": [False, "avg", "min"], "START_ALIGN": [False, "min"]}
    (tmp_path / "sim_conf.json").write_text(json.dumps(conf), encoding="utf-8")

    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(name, None)  # =0 (set by embedded-mode runs) would make the worker refuse to join
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--block", "--disable-usage-stats"]
    head = [RAY, "start", "--head", f"--port={PORT}", "--include-dashboard=false", *common]
    worker = [RAY, "start", f"--address=127.0.0.1:{PORT}", '--resources={"second": 1}', *common]
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "ray-logs"
    logs.mkdir()
    try:
        for name, cmd in (("head", head), ("worker", worker)):
            with (logs / f"{name}.log").open("w") as log:
                procs.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", netns, *cmd],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            if name == "head":
                _wait_for_nodes(netns, env, 1)
        _wait_for_nodes(netns, env, 2)

        proc = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "dsim", "run",
             "--conf", "sim_conf.json", "--out", "cluster", "--executor", "ray",
             "--ray-address", f"127.0.0.1:{PORT}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "6 replay(s) computed on ray" in proc.stderr
        assert all(p.poll() is None for p in procs)  # dsim left the cluster running
    finally:
        _stop(procs)

    local = run_dsim("run", "--conf", "sim_conf.json", "--out", "local", cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    names = sorted(p.name for p in (tmp_path / "local" / RUN).glob("*.parquet"))
    assert len(names) == 6
    assert names == sorted(p.name for p in (tmp_path / "cluster" / RUN).glob("*.parquet"))
    for name in names:
        a = pq.read_table(tmp_path / "local" / RUN / name)
        b = pq.read_table(tmp_path / "cluster" / RUN / name)
        assert a.equals(b) and a.schema.metadata == b.schema.metadata, name
