"""Real Ray clusters for tests, isolated in loopback-only network namespaces.

A namespace has only its own ``lo``, so nothing started in it can reach, or
be reached from, any other address; its ports are private, so fixed port
numbers cannot clash with anyone else's. Every process is stopped by its pid
(never ``ray stop``, which would also stop other people's Ray) and the
namespace is deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

RAY = str(Path(sys.executable).with_name("ray"))


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def network_namespace() -> Iterator[str]:
    """A fresh namespace with loopback up; skips the test where that is not permitted."""
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed")
    name = f"dsim-{uuid.uuid4().hex[:8]}"
    added = ip("netns", "add", name)
    if added.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {added.stderr.strip()}")
    try:
        up = ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        if up.returncode != 0:
            pytest.skip(f"cannot bring up loopback in a namespace: {up.stderr.strip()}")
        yield name
    finally:
        ip("netns", "del", name)


def ray_env(**extra: str) -> dict[str, str]:
    """The environment for Ray nodes and clients: the user's Ray settings removed."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    for name in (
        "RAY_ADDRESS",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",  # =0 would make a worker node refuse to join
        "DSIM_DEBUG",
    ):
        env.pop(name, None)
    env.update(extra)
    return env


def start_node(ns: str, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``ray start ... --block`` inside the namespace, output to ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd], env=env, stdout=out, stderr=subprocess.STDOUT
        )


STOP_GRACE_S = 3.0
"""How long ``stop`` waits after SIGTERM before SIGKILL. Ray's node processes (``ray start
--block``, gcs_server, raylet, its agents) were all still running 15 s after SIGTERM here
(Ray 2.60: checked by polling their states), so a longer grace only delayed the SIGKILL
that ends them: 15 s per cluster in each Ray cluster test's teardown."""


def stop(procs: list[subprocess.Popen]) -> None:
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
    _, alive = psutil.wait_procs(family, timeout=STOP_GRACE_S)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=10)
    for proc in procs:
        proc.wait(timeout=10)


def wait_for_nodes(
    ns: str, env: dict[str, str], port: int, count: int, timeout_s: float = 90
) -> None:
    """Wait until ``count`` nodes are alive; ``env`` must carry the cluster's token if any."""
    probe = (
        "import logging, ray; "
        f"ray.init(address='127.0.0.1:{port}', logging_level=logging.ERROR, log_to_driver=False); "
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
