"""What the browser asked for: the scheme and host of a request, believed from proxies we trust.

A request reaches the door either straight from the browser, or through a reverse proxy that
terminates TLS. Only a peer listed in ``http.trusted_proxies`` may say, with
``X-Forwarded-Proto`` and ``X-Forwarded-Host``, what the browser used; anyone else's forwarded
headers are ignored (a client could otherwise claim ``https`` or any host). Of a header holding
several values, the last is taken: it is the one the nearest proxy, the trusted one, wrote.

The console uses this three ways: its session cookie is ``Secure`` when the browser used HTTPS;
a form's ``Origin`` is compared with the host the browser asked for; and it answers only to
the names of ``console.allowed_hosts``, so a page of another name that resolves to fairq's
address (DNS rebinding) is refused before it can read or post anything.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from fairq_server.config.console import split_host
from fairq_server.config.doors import parse_networks

__all__ = ["Asked", "asked_for", "host_allowed"]


@dataclass(frozen=True)
class Asked:
    """A request as the browser made it.

    Attributes:
        scheme: ``https`` or ``doors/http``.
        host: the ``Host`` the browser sent (``name[:port]``), lower-case.
        via_proxy: a trusted proxy said so (else both are what this door saw).
        scheme_known: the scheme is the browser's own: the connection was TLS, or a trusted
            proxy said which (behind an untrusted proxy, fairq sees HTTP whatever the browser
            used).

    """

    scheme: str
    host: str
    via_proxy: bool
    scheme_known: bool


def _trusted(request: web.Request, proxies: tuple[str, ...]) -> bool:
    if not proxies or not request.remote:
        return False
    try:
        peer = ipaddress.ip_address(request.remote)
    except ValueError:  # not an IP peer (a Unix socket)
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return any(peer in network for network in parse_networks(proxies))


def _last(value: str) -> str:
    return value.rsplit(",", 1)[-1].strip().lower()


def asked_for(request: web.Request, proxies: Sequence[str]) -> Asked:
    """Return what the browser asked for, believing forwarded headers only from ``proxies``."""
    scheme = "https" if request.secure else "http"
    host = request.headers.get("Host", "").strip().lower()
    if not _trusted(request, tuple(proxies)):
        return Asked(scheme, host, via_proxy=False, scheme_known=request.secure)
    proto = _last(request.headers.get("X-Forwarded-Proto", ""))
    forwarded_host = _last(request.headers.get("X-Forwarded-Host", ""))
    known = request.secure or proto in ("http", "https")
    if proto in ("http", "https") and not request.secure:
        scheme = proto
    return Asked(scheme, forwarded_host or host, via_proxy=True, scheme_known=known)


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Whether ``host`` (a ``Host`` header) is one of ``allowed``.

    An entry ``name`` allows that name on any port; ``name:port`` on that port only. Names
    are compared without case and without a trailing dot.
    """
    asked = split_host(host)
    if asked is None:
        return False
    for entry in allowed:
        wanted = split_host(entry)
        if wanted is not None and wanted[0] == asked[0] and wanted[1] in (None, asked[1]):
            return True
    return False
