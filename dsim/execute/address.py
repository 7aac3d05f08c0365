"""Ray cluster addresses: which forms dsim accepts, checked before any work.

Ray itself reports a malformed address as a bare ``ValueError`` (or, for
``:``, a traceback) and waits for minutes on one nobody answers, so dsim
checks the text first and says in one line what is wrong and where the
address came from. Accepted forms:

* ``HOST:PORT`` -- a host name, an IPv4 address or an IPv6 address in
  brackets (``[::1]:6379``), and a port from 1 to 65535;
* ``auto`` -- the cluster running on this machine (resolved at connect time,
  see ``dsim.execute.ray_connect``);
* ``ray://HOST:PORT`` -- a Ray client server, only when the Ray client extra
  (``grpc``) is importable;
* ``local`` or an empty value -- no cluster: an embedded instance (or
  in-process execution for small jobs), as with no address at all.

Pure apart from one ``importlib.util.find_spec`` for the client check, which
imports nothing.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dsim.errors import UsageError

ENV_VAR = "RAY_ADDRESS"
FROM_OPTION = "--ray-address"
FROM_CONFIG = "config ray_address"
FROM_ENV = "RAY_ADDRESS"
#: What a configured address came from when the caller cannot tell option from config.
FROM_SETTINGS = "--ray-address or config ray_address"

CLIENT_PREFIX = "ray://"
EXPECTED = "expected HOST:PORT, auto, or ray://HOST:PORT"
CLIENT_MISSING = "ray:// addresses need the Ray client: pip install 'ray[client]'"

# RFC 1123 host names (labels of letters, digits and inner hyphens; underscores
# tolerated as many internal DNS zones use them).
_HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class RayAddress:
    """A checked cluster address.

    ``kind`` is ``"hostport"``, ``"client"`` (``ray://``) or ``"auto"``;
    ``host``/``port`` are set for the first two (``host`` without brackets).
    ``source`` names where the text came from, for messages.
    """

    text: str
    kind: str
    source: str
    host: str = ""
    port: int = 0

    @property
    def hostport(self) -> str:
        """``HOST:PORT`` as Ray expects it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def client_available() -> bool:
    """Whether ``ray://`` can work: Ray's client needs ``grpc`` (the ``ray[client]`` extra).

    Ray's own check imports ``grpc``; ``find_spec`` answers the same question
    without importing or starting anything.
    """
    try:
        return importlib.util.find_spec("grpc") is not None
    except (ImportError, ValueError):
        return False


def _invalid(text: str, source: str, reason: str = "") -> UsageError:
    why = f"{reason}; " if reason else ""
    return UsageError(f"invalid Ray address {text!r}: {why}{EXPECTED} (from {source})")


def _check_host(host: str, text: str, source: str) -> str:
    if not host:
        raise _invalid(text, source, "the host is empty")
    if host.startswith("["):
        if not host.endswith("]"):
            raise _invalid(text, source, "unclosed bracket in the host")
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise _invalid(text, source, f"{inner!r} is not an IPv6 address") from None
        return inner
    if ":" in host:
        raise _invalid(text, source, "an IPv6 host goes in brackets, e.g. [::1]:6379")
    if not all(_HOST_LABEL.match(label) for label in host.split(".")) or len(host) > 253:
        raise _invalid(text, source, f"{host!r} is not a host name or IP address")
    return host


def _check_port(port: str, text: str, source: str) -> int:
    if not port:
        raise _invalid(text, source, "the port is missing")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise _invalid(text, source, f"port {port!r} is not a number from 1 to 65535")
    return int(port)


def parse_ray_address(text: str | None, source: str) -> RayAddress | None:
    """Check an address; ``None`` means "no cluster" (unset, empty or ``local``).

    Raises ``UsageError`` naming the address, what is wrong and ``source``.
    """
    if text is None or text == "" or text == "local":
        return None
    if text == "auto":
        return RayAddress(text=text, kind="auto", source=source)
    kind = "hostport"
    rest = text
    if text.startswith(CLIENT_PREFIX):
        kind = "client"
        rest = text[len(CLIENT_PREFIX) :]
    elif "://" in text:
        raise _invalid(text, source, "the only URL scheme Ray accepts is ray://")
    host, sep, port = rest.rpartition(":")
    if not sep:
        raise _invalid(text, source, "no port")
    checked_host = _check_host(host, text, source)
    checked_port = _check_port(port, text, source)
    if kind == "client" and not client_available():
        raise UsageError(f"{CLIENT_MISSING} (Ray address {text!r} from {source})")
    return RayAddress(text=text, kind=kind, source=source, host=checked_host, port=checked_port)


def configured_address(
    configured: str | None,
    configured_source: str = FROM_SETTINGS,
    environ: Mapping[str, str] | None = None,
) -> tuple[str | None, str]:
    """The address text to use and where it came from: the setting, else ``RAY_ADDRESS``."""
    if configured:
        return configured, configured_source
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR) or None
    return value, FROM_ENV
