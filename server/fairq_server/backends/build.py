"""Building a backend adapter from its settings, with every check a registration needs."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from fairq_server.backends.base import Backend
from fairq_server.backends.http_reading import ReadLimits
from fairq_server.backends.kinds import BACKEND_KINDS
from fairq_server.config.backends import BackendConfig, check_backend_config
from fairq_server.errors import InvalidRequestError
from fairq_server.names import escape

__all__ = ["host_allowed", "make_backend"]


def host_allowed(host: str, allowlist: Sequence[str]) -> bool:
    """Whether ``host`` (a URL's hostname) is covered by ``allowlist``.

    Names match names exactly (case-insensitive) and are never resolved, so DNS cannot widen
    the list; literal addresses match the listed networks.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower().rstrip(".") in {a.lower().rstrip(".") for a in allowlist}
    for entry in allowlist:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue  # a name, not a network
    return False


def make_backend(
    cfg: BackendConfig,
    *,
    timeout: float = 600.0,
    allowlist: Sequence[str] | None = None,
    read_limits: ReadLimits | None = None,
) -> Backend:
    """Validate ``cfg`` and build its adapter.

    Args:
        cfg: the backend's settings.
        timeout: HTTP timeout towards the backend.
        allowlist: if given, the URL's host must be covered by it (see :func:`host_allowed`).
        read_limits: bounds on what is read from the backend (defaults when None).

    Raises:
        InvalidRequestError: a rule of :func:`~fairq_server.config.backends.check_backend_config`
            broken (id, kind, URL, models, settings), or a host outside the allow-list.

    """
    try:
        url = check_backend_config(cfg)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    assert url.hostname is not None  # check_backend_config refuses a URL without a host
    if allowlist is not None and not host_allowed(url.hostname, allowlist):
        raise InvalidRequestError(
            f"backend host '{escape(url.hostname, 200)}' is not in the allow-list "
            "(admin.backend_allowlist)"
        )
    cls = BACKEND_KINDS[cfg.kind]
    return cls.from_config(
        cfg, timeout=timeout, from_rpc=allowlist is not None, read_limits=read_limits
    )
