"""The ``[console]`` section: the operator's web console on the HTTP door's port."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LOOPBACK_HOSTS", "ConsoleConfig", "check_allowed_hosts", "split_host"]

#: The names the console answers to unless told otherwise: this machine's own.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class ConsoleConfig:
    """The web console under ``/console`` on the HTTP door (admins only).

    Attributes:
        enabled: serve the console (needs ``http.listen``); off by default.
        refresh_seconds: how often the live views are read and pushed to open pages, and how
            often a replica publishes its view to Redis in a cluster.
        session_seconds: a login lasts this long (the key is checked again on every request,
            so a revoked key ends its sessions at once).
        starved_after_seconds: a backlogged user whose next request has waited this long
            while it received less than half its entitlement of recent service is marked
            starved.
        max_users: at most this many users are listed per model and tier (the busiest first;
            the counts always cover everyone).
        allowed_hosts: the host names the console answers to (the ``Host`` the browser sends,
            or the ``X-Forwarded-Host`` of a trusted proxy, ``http.trusted_proxies``): ``name``
            on any port, ``name:port`` on that port only. Any other host is answered 421, so a
            page of another name resolving to fairq's address (DNS rebinding) gets nothing.
        history_seconds: how often the trends (queue depth, waits, time to first token,
            tokens per second) are sampled, whether a page is open or not; 0: no trends.
        history_points: samples kept per figure (360 every 5 s: the last 30 minutes).

    """

    enabled: bool = False
    refresh_seconds: float = 1.0
    session_seconds: float = 8 * 3600.0
    starved_after_seconds: float = 10.0
    max_users: int = 50
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    history_seconds: float = 5.0
    history_points: int = 360


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
