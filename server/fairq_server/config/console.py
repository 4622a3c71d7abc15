"""The ``[console]`` section: the operator's web console on the HTTP door's port."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Bool, Float, Int, Str, doc, section

__all__ = ["LOOPBACK_HOSTS", "ConsoleConfig", "check_allowed_hosts", "split_host"]

#: The names the console answers to unless told otherwise: this machine's own.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@section
@dataclass(frozen=True)
class ConsoleConfig:
    """The web console under ``/console`` on the HTTP door (admins only)."""

    enabled: Annotated[Bool, doc("serve the console (needs ``http.listen``)")] = False
    refresh_seconds: Annotated[
        Float,
        doc(
            "how often the live views are read and pushed to open pages, and how often a "
            "replica publishes its view to Redis in a cluster",
            gt=0,
        ),
    ] = 1.0
    session_seconds: Annotated[
        Float,
        doc(
            "a login lasts this long (the key is checked again on every request, so a revoked "
            "key ends its sessions at once)",
            gt=0,
        ),
    ] = 8 * 3600.0
    starved_after_seconds: Annotated[
        Float,
        doc(
            "a backlogged user whose next request has waited this long while it received less "
            "than half its entitlement of recent service is marked starved",
            gt=0,
        ),
    ] = 10.0
    max_users: Annotated[
        Int,
        doc(
            "at most this many users are listed per model and tier (the busiest first; the "
            "counts always cover everyone)",
            gt=0,
        ),
    ] = 50
    allowed_hosts: Annotated[
        tuple[Str, ...],
        doc(
            "the host names the console answers to (``name`` on any port, ``name:port`` on "
            "that port only); any other host is answered 421 (DNS rebinding)"
        ),
    ] = LOOPBACK_HOSTS
    history_seconds: Annotated[
        Float,
        doc(
            "how often the trends (queue depth, waits, time to first token, tokens per "
            "second) are sampled (0: no trends)",
            ge=0,
        ),
    ] = 5.0
    history_points: Annotated[
        Int, doc("samples kept per figure (360 every 5 s: the last 30 minutes)", ge=0)
    ] = 360


def split_host(value: str) -> tuple[str, int | None] | None:
    """Split ``name[:port]`` (``[v6]:port``; a bare ``::1``) into a lower-case name and port.

    Returns None for a value that is not a host (empty, a bad port, an unclosed bracket).
    """
    value = value.strip().lower()
    port = ""
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
        if rest and not port:
            return None
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
        if not port:
            return None
    else:
        name = value  # a name, or an IPv6 address without brackets (in a configured entry)
    name = name.rstrip(".")
    if not name or (port and not (port.isdigit() and int(port) <= 65535)):
        return None
    return name, int(port) if port else None


def check_allowed_hosts(hosts: Sequence[str]) -> None:
    """Refuse an empty ``console.allowed_hosts`` or an entry that is not ``name[:port]``.

    Raises:
        ValueError: naming the entry at fault.

    """
    if not hosts:
        raise ValueError(
            "console.allowed_hosts must name at least one host (the console would answer none)"
        )
    for i, entry in enumerate(hosts):
        if split_host(entry) is None or any(c in entry for c in "/@ \t"):
            raise ValueError(
                f"console.allowed_hosts[{i}]: {entry[:100]!r} is not a host name or address, "
                "with an optional :port"
            )
