"""Start an embedded Ray instance or join a cluster, failing fast with one clear line.

Ray, left to itself, turns most connection problems into minutes of retries
and screens of C++ warnings: ``auto`` with a stale address file retries for
minutes, a token-protected cluster joined without the token fails after ~20 s
with "Failed to connect" while the cause is only in its warnings. So before
``ray.init`` dsim:

1. checks the address text (``dsim.execute.address``);
2. resolves ``auto`` the way Ray does -- the address the last ``ray start``
   recorded (``<ray temp dir>/ray_current_cluster``), else the GCS of a raylet
   running on this machine -- keeping only addresses that accept a TCP
   connection (``resolve_auto``);
3. checks that the HOST:PORT accepts a TCP connection (``REACHABLE_TIMEOUT_S``);
4. asks the cluster's GCS for its cluster id from a short-lived subprocess
   (``PROBE_TIMEOUT_S``): Ray's ``GcsClient`` answers an authentication
   failure at once, and a subprocess can be stopped if whatever listens there
   never answers;
5. runs ``ray.init`` with file descriptor 2 captured, so Ray's own warnings
   are shown only with ``--debug`` (``DSIM_DEBUG=1``), or when dsim cannot
   explain a failure itself.

Token authentication (Ray versions that have it): Ray sends a token only when
``RAY_AUTH_MODE=token``. A user who sets ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH`` means to send it, so dsim sets ``RAY_AUTH_MODE=token``
when it is unset; for ``auto`` it also does so when ``~/.ray/auth_token``
exists, as Ray itself does for a cluster it finds on this machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsim import processes
from dsim.errors import DsimError, UsageError
from dsim.execute import ray_watch, reaper
from dsim.execute.address import (
    FROM_CONFIG,
    FROM_ENV,
    FROM_OPTION,
    FROM_SETTINGS,
    RayAddress,
    parse_ray_address,
)

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = Path("~/.ray/auth_token")
MARKER_ENV = "DSIM_RAY_OWNER"
#: Ray's C++ core installs absl's failure signal handler in the driver, SIGTERM included:
#: it prints a stack trace ("*** SIGTERM received ..."), passes the signal on to dsim's
#: handler, and arms a 3-s alarm that aborts the process (exit 134) when dsim's clean
#: shutdown takes longer (3 of 13 SIGTERMs during `dsim run --executor ray`). Off in
#: dsim's process unless the user set it.
FAILURE_HANDLER_ENV = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"

#: Set for an embedded instance (unless the user set them; restored afterwards): no usage
#: statistics, no metrics agent exporting what nobody reads. bench/bench_ray_start.py,
#: on 2 busy cores (load 6-9), medians: start + first task + shutdown 6.6 and 9.9 s
#: with them against 11.0 and 13.4 s without (two sessions of 2 and 3 repeats; noisy).
EMBEDDED_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0"}

REACHABLE_TIMEOUT_S = 5.0
AUTO_REACHABLE_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 20.0

#: Substrings of Ray's messages (exceptions and C++ warnings) that mean "authentication failed".
AUTH_FAILURE_MARKS = ("InvalidAuthToken", "Unauthenticated", "UNAUTHENTICATED")
NO_TOKEN_MARK = "no authentication token was found"

# The probe runs in a fresh interpreter, so a GCS that never answers cannot
# hold dsim, and Ray's C++ warnings land in a pipe rather than on the terminal.
_PROBE = r"""
import json, sys
try:
    from ray._raylet import GcsClient
except Exception as exc:
    print(json.dumps({"status": "skip", "detail": repr(exc)}))
    sys.exit(0)
try:
    GcsClient(address=sys.argv[1])
except TypeError as exc:
    print(json.dumps({"status": "skip", "detail": repr(exc)}))
except Exception as exc:
    print(json.dumps({"status": "error", "type": type(exc).__name__, "detail": str(exc)}))
else:
    print(json.dumps({"status": "ok"}))
"""


def debugging() -> bool:
    """``--debug`` / ``DSIM_DEBUG=1``: show Ray's own output instead of capturing it."""
    return os.environ.get("DSIM_DEBUG", "") not in ("", "0")


@dataclass
class Captured:
    """What was written to file descriptor 2 inside ``quiet_stderr``."""

    text: str = ""


@contextlib.contextmanager
def quiet_stderr(enabled: bool = True) -> Iterator[Captured]:
    """Send fd 2 to a temporary file for the duration; ``Captured.text`` holds it afterwards.

    Redirecting the descriptor, not ``sys.stderr``, also catches Ray's C++
    core, which writes its warnings there.
    """
    captured = Captured()
    if not enabled:
        yield captured
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", errors="replace")


def _replay(captured: Captured) -> None:
    """Show captured Ray output when dsim has no better explanation for a failure."""
    if captured.text.strip():
        sys.stderr.write(captured.text)
        sys.stderr.flush()


# --- where the address came from, in words -------------------------------------------


def _named(address: RayAddress) -> str:
    """How the user wrote ``auto``: ``RAY_ADDRESS=auto``, ``--ray-address auto``, ..."""
    if address.source == FROM_ENV:
        return "RAY_ADDRESS=auto"
    if address.source == FROM_OPTION:
        return "--ray-address auto"
    if address.source == FROM_CONFIG:
        return 'config ray_address "auto"'
    return f"Ray address 'auto' (from {address.source})"


def _how_to_unset(address: RayAddress) -> str:
    return {
        FROM_ENV: "unset RAY_ADDRESS",
        FROM_OPTION: "leave out --ray-address",
        FROM_CONFIG: "remove ray_address from the config",
    }.get(address.source, "give no Ray address")


def _setting(address: RayAddress) -> str:
    return {FROM_ENV: "RAY_ADDRESS", FROM_OPTION: "--ray-address", FROM_CONFIG: "ray_address"}.get(
        address.source, "the Ray address"
    )


# --- reachability and auto ----------------------------------------------------------


def _accepts(host: str, port: int, timeout_s: float) -> OSError | None:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return exc
    return None


def check_reachable(address: RayAddress, timeout_s: float = REACHABLE_TIMEOUT_S) -> None:
    """Fail fast on a HOST:PORT nobody listens on: Ray itself retries for minutes."""
    error = _accepts(address.host, address.port, timeout_s)
    if error is not None:
        reason = error.strerror or str(error) or type(error).__name__
        raise UsageError(
            f"cannot connect to the Ray cluster at {address.hostport}: {reason} "
            f"(from {address.source}; is `ray start --head` running there?)"
        )


def _local_clusters() -> tuple[str | None, list[str]] | None:
    """Ray's two sources for ``auto``: the recorded address and running GCS addresses.

    ``None`` when this Ray does not expose them (then ``auto`` goes to Ray as is).
    """
    try:
        from ray._private.services import find_gcs_addresses
        from ray._private.utils import read_ray_address
    except ImportError:
        return None
    try:
        recorded = read_ray_address() or None
    except OSError:
        recorded = None
    return recorded, sorted(find_gcs_addresses())


def _split(hostport: str) -> tuple[str, int] | None:
    try:
        parsed = parse_ray_address(hostport, "ray")
    except UsageError:
        return None
    if parsed is None or parsed.kind != "hostport":
        return None
    return parsed.host, parsed.port


def resolve_auto(address: RayAddress) -> RayAddress | None:
    """The HOST:PORT that ``auto`` means on this machine, or a ``UsageError``.

    Ray's order: the address recorded by the last ``ray start``, else a GCS
    address from a running raylet's command line. Only addresses that accept
    a connection count, so a stale record fails in milliseconds instead of
    after minutes of retries. Several live clusters and no record: refused as
    ambiguous. ``None``: this Ray has no such lookup; pass ``auto`` to Ray.
    """
    found = _local_clusters()
    if found is None:
        return None
    recorded, running = found
    candidates = [recorded] if recorded else []
    candidates += [a for a in running if a != recorded]
    live: list[tuple[str, tuple[str, int]]] = []
    for text in candidates:
        parts = _split(text)
        if parts is not None and _accepts(*parts, AUTO_REACHABLE_TIMEOUT_S) is None:
            live.append((text, parts))
    if not live:
        raise UsageError(
            f"{_named(address)} but no Ray cluster is running on this machine "
            f"(start one with `ray start --head`, or {_how_to_unset(address)} "
            "to use an embedded instance)"
        )
    if len(live) > 1 and live[0][0] != recorded:
        listed = ", ".join(text for text, _ in live)
        raise UsageError(
            f"{_named(address)} but several Ray clusters are running on this machine "
            f"({listed}): set {_setting(address)} to one of them"
        )
    chosen = live[0]
    host, port = chosen[1]
    return RayAddress(text=chosen[0], kind="hostport", source=address.source, host=host, port=port)


# --- authentication -------------------------------------------------------------------


def _token_source() -> str | None:
    """Where Ray will take a token from, in its own order of precedence."""
    if os.environ.get(TOKEN_ENV):
        return TOKEN_ENV
    if os.environ.get(TOKEN_PATH_ENV):
        return f"{TOKEN_PATH_ENV} ({os.environ[TOKEN_PATH_ENV]})"
    if DEFAULT_TOKEN_FILE.expanduser().is_file():
        return str(DEFAULT_TOKEN_FILE)
    return None


def enable_token_if_given(from_auto: bool) -> None:
    """Set ``RAY_AUTH_MODE=token`` when unset and the user gave a token (see module doc)."""
    if os.environ.get(AUTH_MODE_ENV):
        return
    given = bool(os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV))
    if given or (from_auto and DEFAULT_TOKEN_FILE.expanduser().is_file()):
        os.environ[AUTH_MODE_ENV] = "token"
        _refresh_ray_config()


def _refresh_ray_config() -> None:
    """Make an imported Ray re-read ``RAY_*`` settings, as Ray does when it enables tokens.

    Ray's C++ config reads the environment once, when ``ray`` is imported.
    """
    if "ray" not in sys.modules:
        return
    with contextlib.suppress(Exception):
        from ray._raylet import Config

        Config.initialize("")


def is_auth_failure(text: str) -> bool:
    return any(mark in text for mark in AUTH_FAILURE_MARKS) or NO_TOKEN_MARK in text


def auth_error(hostport: str, detail: str) -> UsageError:
    """The one line for an authentication failure, saying what to set."""
    how = f"set {TOKEN_ENV} (or {TOKEN_PATH_ENV}) to the cluster's token"
    mode = os.environ.get(AUTH_MODE_ENV, "")
    if NO_TOKEN_MARK in detail:
        return UsageError(
            f"{AUTH_MODE_ENV}=token but no authentication token was found: set {TOKEN_ENV} "
            f"(or {TOKEN_PATH_ENV}) to the token of the Ray cluster at {hostport}"
        )
    if mode.lower() != "token":
        extra = f" and unset {AUTH_MODE_ENV} (it is {mode!r})" if mode else ""
        return UsageError(
            f"the Ray cluster at {hostport} requires an authentication token: {how}{extra}"
        )
    source = _token_source() or "the configured source"
    return UsageError(
        f"the Ray cluster at {hostport} refused the authentication token from {source}: {how}"
    )


@dataclass
class ProbeResult:
    status: str  # ok | error | skip | timeout
    type: str = ""
    detail: str = ""
    stderr: str = field(default="", repr=False)


def probe(hostport: str, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Ask the GCS at ``hostport`` for its cluster id from a subprocess (see module doc)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, hostport],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=os.environ.copy(),
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        return ProbeResult("timeout", stderr=err or "")
    for line in reversed(proc.stdout.splitlines()):
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if isinstance(answer, dict) and "status" in answer:
            return ProbeResult(
                str(answer["status"]),
                str(answer.get("type", "")),
                str(answer.get("detail", "")),
                proc.stderr,
            )
    return ProbeResult("skip", detail=f"probe exited with {proc.returncode}", stderr=proc.stderr)


def _check_cluster(address: RayAddress, debug: bool) -> None:
    result = probe(address.hostport)
    if debug and result.stderr:
        sys.stderr.write(result.stderr)
    if result.status == "timeout":
        raise UsageError(
            f"cannot connect to the Ray cluster at {address.hostport}: it accepts connections "
            f"but did not answer as a Ray cluster within {PROBE_TIMEOUT_S:.0f} s "
            f"(from {address.source}; give the port of `ray start --head`, 6379 by default)"
        )
    if result.status != "error":
        return  # ok, or this Ray cannot probe: ray.init decides
    text = f"{result.type}: {result.detail}\n{result.stderr}"
    if result.type == "AuthenticationError" or is_auth_failure(text):
        raise auth_error(address.hostport, text)
    raise UsageError(
        f"cannot connect to the Ray cluster at {address.hostport}: "
        f"{result.detail.strip().splitlines()[0] if result.detail.strip() else result.type} "
        f"(from {address.source})"
    )


# --- the session ----------------------------------------------------------------------


@dataclass
class _Session:
    saved_env: dict[str, str | None]
    watchdog: subprocess.Popen[bytes] | None = None
    head: tuple[str, int] | None = None  # the GCS of a joined cluster (HOST, PORT)


_session: _Session | None = None


def _save_env(*names: str) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


def _restore_env(saved: dict[str, str | None]) -> None:
    """Undo our settings so that later Ray calls from this process see the user's."""
    changed = False
    for name, value in saved.items():
        changed |= name == AUTH_MODE_ENV and os.environ.get(name) != value
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if changed:
        _refresh_ray_config()


def _import_ray() -> Any:
    # Must be set before Ray starts: it binds the embedded node to 127.0.0.1.
    os.environ[LOOPBACK_ENV] = "0"
    without_failure_handler = FAILURE_HANDLER_ENV not in os.environ
    if without_failure_handler:
        os.environ[FAILURE_HANDLER_ENV] = "1"  # read once, when Ray is imported
    try:
        import ray
    finally:
        if without_failure_handler:  # Ray's own processes keep their crash reports
            os.environ.pop(FAILURE_HANDLER_ENV, None)
    if without_failure_handler:  # in case Ray was imported before (the Python API)
        with contextlib.suppress(Exception):
            ray._private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    return ray


def _init(ray: Any, **options: Any) -> None:
    """``ray.init`` whole, with dsim's SIGINT/SIGTERM handlers kept.

    ``ray.init`` replaces the SIGTERM handler with one that calls
    ``sys.exit(15)`` wherever the driver happens to be, its own start-up
    included; cut short there, Ray's half-built core crashed the interpreter at
    exit (SIGSEGV). So Ray is kept from replacing the handler, and a signal
    during the call is only noted (``processes.deferred_signals``): ``connect``
    acts on it once Ray is up (shutting it down again). Afterwards a SIGTERM
    takes dsim's one clean path (``KeyboardInterrupt``, recorded, exit 143).
    """
    ours = processes.handles(signal.SIGTERM)
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    replace = getattr(utils, "set_sigterm_handler", None) if ours else None
    if replace is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        with processes.deferred_signals():
            ray.init(**options)
    finally:
        if replace is not None:
            utils.set_sigterm_handler = replace
    if ours:
        # Always, not only when Python's record of the handler changed: Ray 2.10's core
        # installs absl's failure handlers and, removing them, leaves SIGTERM at the
        # kernel's default while Python still names dsim's handler (killed by the signal,
        # exit -15, no message); signal.signal sets it with the kernel again.
        processes.install_handlers()


def max_embedded_cpus() -> int:
    """The most CPUs the embedded Ray may be given on this machine.

    Ray starts up to one worker process per CPU it is given (~100 MB each):
    ``num_cpus: 10**9`` made its start-up time out after 38 s. 16 per core (at
    least 64) leaves room for deliberate oversubscription.
    """
    return max(64, 16 * (os.cpu_count() or 1))


def check_embedded_cpus(num_cpus: int | None) -> None:
    """A ``UsageError`` at once for a CPU count the embedded Ray cannot start with."""
    limit = max_embedded_cpus()
    if num_cpus is not None and num_cpus > limit:
        raise UsageError(
            f"num_cpus {num_cpus} is more than the embedded Ray can start on this machine "
            f"(at most {limit}: {os.cpu_count() or 1} cores; Ray starts a worker process per "
            "CPU): give fewer, or join a cluster with --ray-address"
        )


def _start_embedded(ray: Any, num_cpus: int | None, debug: bool) -> subprocess.Popen[bytes] | None:
    """``ray.init`` of a private instance, watched so that it dies with this process."""
    check_embedded_cpus(num_cpus)
    for name, value in EMBEDDED_ENV.items():  # what the user set stays as they set it
        os.environ.setdefault(name, value)
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    try:
        watchdog = reaper.start(f"{MARKER_ENV}={marker}", debug=debug)
    except OSError:  # pragma: no cover - no way to start a process: run without it
        watchdog = None
    os.environ[MARKER_ENV] = marker
    try:
        with quiet_stderr(not debug) as captured:
            try:
                _init(
                    ray,
                    address="local",
                    num_cpus=num_cpus or os.cpu_count() or 1,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    include_dashboard=False,
                )
                error = None
            except Exception as exc:
                error = exc
    finally:
        os.environ.pop(MARKER_ENV, None)
    if error is not None:
        _replay(captured)
        if watchdog is not None:
            reaper.stop(watchdog)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise DsimError(
            f"cannot start Ray on this machine: {type(error).__name__}: {first} "
            "(--debug shows Ray's output; --executor local runs without Ray)"
        ) from error
    return watchdog


def _join(ray: Any, address: RayAddress, debug: bool) -> tuple[str, int] | None:
    """``ray.init`` of an existing cluster, after the checks of the module doc; the
    HOST:PORT of its GCS when known (not for ``ray://`` or an unresolved ``auto``)."""
    target = address.text
    if address.kind == "auto":
        resolved = resolve_auto(address)
        enable_token_if_given(from_auto=True)
        if resolved is not None:
            address, target = resolved, resolved.hostport
    else:
        enable_token_if_given(from_auto=False)
    if address.kind != "auto":
        check_reachable(address)
    if address.kind == "hostport":
        _check_cluster(address, debug)
    # Ray's client (ray://) passes unknown init options on to the server; give it none.
    options: dict[str, Any] = (
        {} if address.kind == "client" else {"log_to_driver": False, "logging_level": logging.ERROR}
    )
    where = address.hostport if address.kind != "auto" else "auto"
    with quiet_stderr(not debug) as captured:
        try:
            _init(ray, address=target, **options)
            error = None
        except Exception as exc:
            error = exc
    if error is None:
        return (address.host, address.port) if address.kind == "hostport" else None
    text = f"{type(error).__name__}: {error}\n{captured.text}"
    if type(error).__name__ == "AuthenticationError" or is_auth_failure(text):
        raise auth_error(where, text) from error
    _replay(captured)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise UsageError(
        f"cannot connect to the Ray cluster at {where}: {first} (from {address.source})"
    ) from error


def connect(
    address: str | None, num_cpus: int | None, *, source: str = FROM_SETTINGS
) -> tuple[Any, bool]:
    """Start or join Ray; returns the module and whether this call started it.

    ``address`` is the text to join (``None``, ``""`` or ``local``: start an
    embedded instance); ``source`` names where it came from, for messages.
    Call ``disconnect`` with the same module and flag afterwards.
    """
    global _session
    parsed = parse_ray_address(address, source)
    debug = debugging()
    saved = _save_env(LOOPBACK_ENV, AUTH_MODE_ENV, *EMBEDDED_ENV)
    ray = _import_ray()
    if ray.is_initialized():
        _restore_env(saved)
        return ray, False
    first = processes.received() is None
    try:
        if parsed is None:
            _session = _Session(saved, _start_embedded(ray, num_cpus, debug))
        else:
            _session = _Session(saved, head=_join(ray, parsed, debug))
    except BaseException:
        _restore_env(saved)
        raise
    if first and processes.received() is not None:  # a signal came during ray.init
        disconnect(ray, True)
        raise KeyboardInterrupt
    return ray, True


def joined_head() -> tuple[str, int] | None:
    """The GCS HOST:PORT of the cluster ``connect`` joined (None: embedded, or unknown)."""
    return _session.head if _session is not None else None


def disconnect(ray: Any, started: bool, *, lost: bool = False) -> None:
    """Shut down what ``connect`` started (a joined cluster keeps running), quietly.

    ``lost``: the cluster died; ``ray.shutdown`` may wait on it, so it gets a few
    seconds, after which the process is left to ``os._exit`` (``ray_watch``).
    """
    global _session
    if not started:
        return
    session, _session = _session, None
    first = processes.received() is None
    try:
        # Whole or not at all: a signal meanwhile is acted on after (processes.deferred_signals).
        with processes.deferred_signals(), quiet_stderr(not debugging()):
            if not lost:
                ray.shutdown()
            elif not ray_watch.bounded(ray.shutdown):
                processes.request_hard_exit()
    finally:
        if session is not None:
            if session.watchdog is not None:
                reaper.stop(session.watchdog)
            _restore_env(session.saved_env)
    if first and processes.received() is not None:  # the first signal came during shutdown
        raise KeyboardInterrupt
