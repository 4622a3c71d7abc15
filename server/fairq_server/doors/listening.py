"""Binding fairq's listening addresses, with one line naming the address and its key on failure.

Each listener fails in its own way when its port is taken: gRPC raises a ``RuntimeError`` that
carries no reason (and its core logs a line of its own), the HTTP door's aiohttp and the
metrics endpoint raise ``OSError`` without saying which setting chose the address. An operator
needs one line: ``cannot listen on 127.0.0.1:50051 (set by listen): address already in use``.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator

import grpc

__all__ = ["ListenError", "add_grpc_port", "listening"]

_REASONS = {
    errno.EADDRINUSE: "address already in use (another process listens there)",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "no such address on this machine",
}


class ListenError(OSError):
    """A listening address could not be bound; the message names it and its setting."""

    def __init__(self, key: str, address: str, code: int | None, detail: str = "") -> None:
        reason = _REASONS.get(code or 0) or detail or "cannot bind"
        super().__init__(code or 0, f"cannot listen on {address} (set by {key}): {reason}")
        self.key = key
        self.address = address

    def __str__(self) -> str:
        return str(self.strerror)


@contextlib.contextmanager
def listening(key: str, address: str) -> Iterator[None]:
    """Turn an ``OSError`` raised while binding ``address`` into a :class:`ListenError`.

    Args:
        key: the configuration key that set the address (``http.listen``, ...).
        address: ``host:port`` as configured.

    """
    try:
        yield
    except ListenError:
        raise
    except OSError as exc:
        raise ListenError(key, address, exc.errno, exc.strerror or str(exc)) from None


def add_grpc_port(
    server: grpc.aio.Server, key: str, address: str, credentials: grpc.ServerCredentials | None
) -> int:
    """Bind ``address`` on the gRPC ``server``; return the port bound.

    The address is tried with a plain socket first, as gRPC binds it (``SO_REUSEADDR``, dual
    stack), so that a port in use is reported with its reason and without gRPC core's own log
    line; a failure gRPC still meets (a race, an address the probe does not cover) is reported
    the same way.

    Raises:
        ListenError: the address cannot be bound.

    """
    code = _probe(address)
    if code is not None:
        raise ListenError(key, address, code)
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpc's "Failed to bind to address": no reason attached
        raise ListenError(key, address, _probe(address)) from None
    if port == 0:
        raise ListenError(key, address, _probe(address))
    return port


def _probe(address: str) -> int | None:
    """Return the errno binding ``address`` meets, or None if it binds (or is not host:port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) == 0 or address.startswith("unix"):
        return None
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None,
            int(port_text),
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )
    except socket.gaierror:
        return None  # gRPC resolves it itself, and says so
    code: int | None = None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                code = exc.errno
                continue
            return None  # gRPC binds if any resolved address binds
    return code
