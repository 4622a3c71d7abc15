"""Building a backend adapter from its settings, with every check a registration needs."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

import yarl

from fairq_server.backends.base import Backend
from fairq_server.backends.kinds import BACKEND_KINDS
from fairq_server.config import BackendConfig
from fairq_server.errors import InvalidRequestError

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
) -> Backend:
    """Validate ``cfg`` and build its adapter.

    Args:
        cfg: the backend's settings.
        timeout: HTTP timeout towards the backend.
        allowlist: if given, the URL's host must be covered by it (see :func:`host_allowed`).

    Raises:
        InvalidRequestError: unknown kind, a URL that is not plain http(s), a host outside the
            allow-list, or no models.

    """
    if not cfg.id or len(cfg.id) > 128:
        raise InvalidRequestError("backend id must be 1-128 characters")
    cls = BACKEND_KINDS.get(cfg.kind)
    if cls is None:
        raise InvalidRequestError(
            f"backend kind {cfg.kind!r} unknown; valid: {', '.join(BACKEND_KINDS)}"
        )
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in cfg.base_url):
        raise InvalidRequestError("backend base_url contains spaces or control characters")
    try:
        url = urlsplit(cfg.base_url)
        url.port  # noqa: B018 - raises ValueError for a port that is not 0-65535
    except ValueError as exc:
        raise InvalidRequestError(f"backend base_url is not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise InvalidRequestError(
            f"backend base_url must be http(s)://host[:port], not {cfg.base_url!r}"
        )
    if url.query or url.fragment or url.username or url.password:
        raise InvalidRequestError("backend base_url must not carry credentials, query or fragment")
    if allowlist is not None and not host_allowed(url.hostname, allowlist):
        raise InvalidRequestError(
            f"backend host '{url.hostname}' is not in the allow-list (admin.backend_allowlist)"
        )
    if not cfg.models or any(not m for m in cfg.models):
        raise InvalidRequestError("backend must serve at least one named model")
    try:
        yarl.URL(cfg.base_url)  # what the HTTP client will make of it (e.g. an IDNA host)
    except ValueError as exc:
        raise InvalidRequestError(f"backend base_url is not a valid URL: {exc}") from None
    return cls.from_config(cfg, timeout=timeout, from_rpc=allowlist is not None)
