"""Ray addresses and connection failures: one clear line, exit code 2, within seconds.

Every case runs the real CLI. Cases that need a Ray cluster (``auto`` with a
stale record, a token-protected cluster) run inside a loopback-only network
namespace (see ``raycluster``), so that no other Ray on this machine can
answer and nothing outside it can be reached.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import run_dsim
from raycluster import RAY, network_namespace, ray_env, start_node, stop, wait_for_nodes
from tracegen import write_synthetic

from dsim.errors import UsageError
from dsim.execute import address as address_mod
from dsim.execute import ray_connect
from dsim.execute.address import parse_ray_address

RUN = "errs_run"
PORT = 6391  # inside a private namespace


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "traces", RUN, iterations=15)
    return tmp_path


def _closed_port() -> int:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    """Exit code 2 and exactly one line on stderr, no traceback, no Ray log output."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dsim: error: "), proc.stderr
    return lines[0]


# --- malformed addresses: refused with the config, before any work -------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("garbage", "no port"),
        ("127.0.0.1:notaport", "port 'notaport' is not a number from 1 to 65535"),
        (":", "the host is empty"),
        ("127.0.0.1:0", "port '0' is not a number from 1 to 65535"),
        ("127.0.0.1:70000", "port '70000' is not a number from 1 to 65535"),
        ("::1:6379", "an IPv6 host goes in brackets"),
        ("[nonsense]:6379", "'nonsense' is not an IPv6 address"),
        ("http://127.0.0.1:6379", "the only URL scheme Ray accepts is ray://"),
        ("bad host:6379", "'bad host' is not a host name or IP address"),
    ],
)
def test_malformed_ray_address_env_is_one_line(workdir: Path, text: str, reason: str) -> None:
    proc = run_dsim("run", RUN, "--out", "res", cwd=workdir, env={"RAY_ADDRESS": text})
    line = _one_error_line(proc)
    assert f"invalid Ray address {text!r}: {reason}" in line
    assert "expected HOST:PORT, auto, or ray://HOST:PORT (from RAY_ADDRESS)" in line
    assert not (workdir / "res").exists()  # refused before any work


def test_malformed_address_names_option_and_config(workdir: Path) -> None:
    proc = run_dsim("run", RUN, "--ray-address", "garbage", "--out", "res", cwd=workdir)
    assert "(from --ray-address)" in _one_error_line(proc)

    conf = {"FILE": RUN, "ray_address": "h:p", "executor": "bogus"}
    (workdir / "sim_conf.json").write_text(json.dumps(conf), encoding="utf-8")
    proc = run_dsim("run", "--conf", "sim_conf.json", cwd=workdir)
    line = _one_error_line(proc)
    assert "2 problems" in line  # reported with the config's other problems
    assert "invalid Ray address 'h:p'" in line and "(from config ray_address)" in line


def test_ray_address_env_is_ignored_in_process(workdir: Path) -> None:
    """--executor local never uses RAY_ADDRESS, so a bad one does not matter."""
    proc = run_dsim(
        "run", RUN, "--executor", "local", "-q", cwd=workdir, env={"RAY_ADDRESS": "garbage"}
    )
    assert proc.returncode == 0, proc.stderr


def test_ray_client_address_without_the_client_extra(workdir: Path) -> None:
    if address_mod.client_available():
        pytest.skip("grpc is installed (the ray[client] extra): ray:// is accepted here")
    proc = run_dsim("run", RUN, cwd=workdir, env={"RAY_ADDRESS": "ray://127.0.0.1:10001"})
    line = _one_error_line(proc)
    assert "ray:// addresses need the Ray client: pip install 'ray[client]'" in line
    assert "from RAY_ADDRESS" in line


def test_accepted_forms() -> None:
    assert parse_ray_address(None, "x") is None
    assert parse_ray_address("", "x") is None
    assert parse_ray_address("local", "x") is None
    assert parse_ray_address("auto", "x").kind == "auto"  # type: ignore[union-attr]
    parsed = parse_ray_address("[::1]:6379", "x")
    assert parsed is not None and (parsed.host, parsed.port) == ("::1", 6379)
    assert parsed.hostport == "[::1]:6379"
    parsed = parse_ray_address("head-node.example_zone.internal:10001", "x")
    assert parsed is not None and parsed.port == 10001


def test_local_means_embedded_and_keeps_small_jobs_in_process(workdir: Path) -> None:
    proc = run_dsim("run", RUN, "--out", "res", cwd=workdir, env={"RAY_ADDRESS": "local"})
    assert proc.returncode == 0, proc.stderr
    assert "computed on local" in proc.stderr


def test_too_many_cpus_for_the_embedded_ray_is_one_line_at_once(workdir: Path) -> None:
    """Issue #20: ``num_cpus: 10**9`` made Ray's start-up time out after 38 s (exit 1)."""
    began = time.monotonic()
    proc = run_dsim(
        "run", RUN, "--out", "res", "--executor", "ray", "--num-cpus", str(10**9), cwd=workdir
    )
    assert time.monotonic() - began < 20
    line = _one_error_line(proc)
    limit = ray_connect.max_embedded_cpus()
    assert f"--num-cpus must be an integer from 1 to {limit}" in line, line
    assert proc.returncode == 2
    assert not (workdir / "res").exists() or not any((workdir / "res").glob("*/*.parquet"))
    # The same bound guards the Ray start itself (the Python API, a config read elsewhere).
    with pytest.raises(UsageError, match=f"num_cpus {10**9} is more than the embedded Ray"):
        ray_connect.check_embedded_cpus(10**9)
    ray_connect.check_embedded_cpus(limit)


def test_a_failed_embedded_start_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever makes ``ray.init`` fail (a full /tmp, ports taken) is a one-line DsimError."""
    from dsim.errors import DsimError

    class FakeRay:
        def init(self, **kwargs: object) -> None:
            raise TimeoutError("Timed out after 30 seconds waiting for the GCS\nmore")

    monkeypatch.setattr(ray_connect.reaper, "start", lambda *a, **k: None)
    with pytest.raises(DsimError, match="cannot start Ray on this machine: TimeoutError: Timed"):
        ray_connect._start_embedded(FakeRay(), 2, debug=False)


# --- unreachable addresses -------------------------------------------------------------


@pytest.mark.ray
def test_unreachable_port_is_one_line_and_fast(workdir: Path) -> None:
    port = _closed_port()
    began = time.monotonic()
    proc = run_dsim("run", RUN, cwd=workdir, env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert time.monotonic() - began < 30  # Ray alone retries for minutes
    line = _one_error_line(proc)
    assert f"cannot connect to the Ray cluster at 127.0.0.1:{port}" in line
    assert "from RAY_ADDRESS" in line


@pytest.mark.ray
def test_auto_with_no_cluster_fails_within_seconds(workdir: Path) -> None:
    """A stale cluster record (Ray's ``ray_current_cluster``) made Ray retry for minutes."""
    with network_namespace() as ns, tempfile.TemporaryDirectory(prefix="dsimray") as raytmp:
        record = Path(raytmp) / "ray" / "ray_current_cluster"
        record.parent.mkdir()
        record.write_text(f"127.0.0.1:{PORT}", encoding="utf-8")  # nobody listens in the namespace
        env = ray_env(RAY_ADDRESS="auto", RAY_TMPDIR=raytmp)
        began = time.monotonic()
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "dsim", "run", RUN, "--out", "res"],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        elapsed = time.monotonic() - began
    line = _one_error_line(proc)
    assert line == (
        "dsim: error: RAY_ADDRESS=auto but no Ray cluster is running on this machine "
        "(start one with `ray start --head`, or unset RAY_ADDRESS to use an embedded instance)"
    )
    # Ray's retries took minutes; importing dsim and Ray alone took up to 10.3 s on a loaded
    # 2-core machine, so the bound tells the two apart without timing the imports
    assert elapsed < 30, elapsed


def _listening() -> tuple[socket.socket, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


def test_auto_prefers_the_recorded_cluster_and_skips_stale_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auto = parse_ray_address("auto", address_mod.FROM_ENV)
    assert auto is not None
    first, live_a = _listening()
    second, live_b = _listening()
    stale = f"127.0.0.1:{_closed_port()}"
    try:
        cases = {
            (live_a, (live_a, live_b)): live_a,  # the record wins, as in Ray
            (stale, (live_b,)): live_b,  # a stale record: the one running cluster
            (None, (live_b,)): live_b,
        }
        for (recorded, running), expected in cases.items():
            monkeypatch.setattr(
                ray_connect, "_local_clusters", lambda r=recorded, g=running: (r, list(g))
            )
            resolved = ray_connect.resolve_auto(auto)
            assert resolved is not None and resolved.hostport == expected

        monkeypatch.setattr(ray_connect, "_local_clusters", lambda: (stale, [live_a, live_b]))
        with pytest.raises(UsageError, match="several Ray clusters are running"):
            ray_connect.resolve_auto(auto)
        monkeypatch.setattr(ray_connect, "_local_clusters", lambda: (stale, [stale]))
        with pytest.raises(UsageError, match="no Ray cluster is running on this machine"):
            ray_connect.resolve_auto(auto)
    finally:
        first.close()
        second.close()


def test_auth_failure_in_rays_own_output_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback when the probe cannot run: Ray's C++ warning names the cause."""
    warning = (
        "[2026-01-01 00:00:00,000 W 1 1] gcs_client.cc:210: Failed to get cluster ID from GCS "
        "server: Unauthenticated: RPC error: InvalidAuthToken: Authentication token is missing"
    )
    assert ray_connect.is_auth_failure(warning)
    assert not ray_connect.is_auth_failure("TimedOut: Timed out while waiting for GCS")
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert "requires an authentication token" in str(ray_connect.auth_error("h:1", warning))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x")
    assert "refused the authentication token from RAY_AUTH_TOKEN" in str(
        ray_connect.auth_error("h:1", warning)
    )


# --- a token-protected cluster --------------------------------------------------------


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[tuple[str, str]]:
    """A one-node cluster with RAY_AUTH_MODE=token in a private namespace: (namespace, token).

    Ray added token authentication long after dsim's floor (2.10); an older Ray
    ignores RAY_AUTH_MODE and starts an open cluster, so there is nothing to test.
    """
    if importlib.util.find_spec("ray._private.authentication") is None:
        pytest.skip(f"Ray {version('ray')} has no token authentication")
    token = secrets.token_hex(32)
    with (
        network_namespace() as ns,
        tempfile.TemporaryDirectory(prefix="dsimray") as raytmp,
    ):
        # Its own temp dir and HOME: no ~/.ray/auth_token, and /tmp/ray is left alone.
        env = ray_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, HOME=raytmp)
        head = [
            RAY, "start", "--head", f"--port={PORT}", "--include-dashboard=false",
            "--node-ip-address=127.0.0.1", "--num-cpus=1", "--block", "--disable-usage-stats",
            f"--temp-dir={raytmp}/ray",
        ]  # fmt: skip
        procs = [start_node(ns, head, env, Path(raytmp) / "head.log")]
        try:
            wait_for_nodes(ns, env, PORT, 1)
            yield ns, token
        finally:
            stop(procs)


def _run_in(
    ns: str, cwd: Path, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "dsim", *args],
        cwd=cwd,
        env=ray_env(HOME=str(cwd), RAY_ADDRESS=f"127.0.0.1:{PORT}", **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, time.monotonic() - began


@pytest.mark.ray
def test_token_cluster_without_token(token_cluster: tuple[str, str], workdir: Path) -> None:
    ns, _ = token_cluster
    proc, elapsed = _run_in(ns, workdir, "run", RUN, "--executor", "ray")
    assert _one_error_line(proc) == (
        f"dsim: error: the Ray cluster at 127.0.0.1:{PORT} requires an authentication token: "
        "set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token"
    )
    assert elapsed < 15, elapsed  # Ray alone: ~20 s of retries


@pytest.mark.ray
def test_token_cluster_with_wrong_token(token_cluster: tuple[str, str], workdir: Path) -> None:
    ns, _ = token_cluster
    proc, elapsed = _run_in(ns, workdir, "run", RUN, "--executor", "ray", RAY_AUTH_TOKEN="nope")
    assert _one_error_line(proc) == (
        f"dsim: error: the Ray cluster at 127.0.0.1:{PORT} refused the authentication token "
        "from RAY_AUTH_TOKEN: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token"
    )
    assert elapsed < 15, elapsed

    # --debug shows Ray's own output, which a normal run keeps off the terminal.
    proc, _ = _run_in(ns, workdir, "--debug", "run", RUN, "--executor", "ray", RAY_AUTH_TOKEN="x")
    assert "InvalidAuthToken" in proc.stderr


@pytest.mark.ray
def test_token_from_a_file_is_enough(token_cluster: tuple[str, str], workdir: Path) -> None:
    """RAY_AUTH_TOKEN_PATH without RAY_AUTH_MODE: dsim turns token mode on (Ray would not)."""
    ns, token = token_cluster
    (workdir / "token").write_text(token, encoding="utf-8")
    proc, _ = _run_in(
        ns, workdir, "run", RUN, "--executor", "ray", RAY_AUTH_TOKEN_PATH=str(workdir / "token")
    )
    assert proc.returncode == 0, proc.stderr
    assert "computed on ray" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr  # dsim's own line only, no Ray output
