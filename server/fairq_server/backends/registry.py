"""The set of registered backends, their pollers and their load."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import yarl

from fairq_server.backends.base import Backend
from fairq_server.backends.poller import MetricsPoller
from fairq_server.backends.tgi import TgiBackend
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config import BackendConfig
from fairq_server.errors import InvalidRequestError
from fairq_server.scheduling.gate import BackendLoad
from fairq_server.scheduling.prefix import PrefixCache

__all__ = ["BACKEND_KINDS", "BackendEntry", "BackendPool", "host_allowed", "make_backend"]

BACKEND_KINDS: Mapping[str, type[Backend]] = {"vllm": VllmBackend, "tgi": TgiBackend}


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
    return cls(
        cfg.id,
        cfg.base_url,
        cfg.models,
        priority_scheduling=cfg.priority_scheduling,
        max_in_flight=cfg.max_in_flight,
        timeout=timeout,
    )


@dataclass
class BackendEntry:
    """A registered backend with its live load and poller."""

    backend: Backend
    load: BackendLoad
    poller: MetricsPoller
    prefixes: PrefixCache
    task: asyncio.Task[None] | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def healthy(self) -> bool:
        """False once the poller counts it unhealthy, until a scrape succeeds again."""
        return self.poller.healthy is not False


class BackendPool:
    """Registered backends by id, and which serve each model."""

    def __init__(
        self,
        *,
        poll_interval: float,
        on_update: Callable[[MetricsPoller | None], None],
        prefix_cache_blocks: int = 20_000,
        unhealthy_after_failures: int = 2,
    ) -> None:
        self._prefix_cache_blocks = prefix_cache_blocks
        self._unhealthy_after_failures = unhealthy_after_failures
        self._entries: dict[str, BackendEntry] = {}
        self._poll_interval = poll_interval
        self._on_update = on_update
        self._closing: dict[asyncio.Task[None], BackendEntry] = {}

    def set_polling(self, interval: float, unhealthy_after_failures: int) -> None:
        """Apply a new poll interval and failure threshold to every poller, now and later ones.

        A running poller takes the interval from its next scrape on.
        """
        self._poll_interval = interval
        self._unhealthy_after_failures = unhealthy_after_failures
        for entry in self._entries.values():
            entry.poller.interval = interval
            entry.poller.unhealthy_after_failures = unhealthy_after_failures

    def entries(self) -> list[BackendEntry]:
        """Return all registered backends."""
        return list(self._entries.values())

    def get(self, backend_id: str) -> BackendEntry | None:
        """Return the backend registered as ``backend_id``."""
        return self._entries.get(backend_id)

    def for_model(self, model: str) -> list[BackendEntry]:
        """Return the backends serving ``model`` (draining ones included)."""
        return [e for e in self._entries.values() if model in e.backend.models]

    def models(self) -> set[str]:
        """Return every model some backend serves."""
        return {m for e in self._entries.values() for m in e.backend.models}

    async def add(self, backend: Backend) -> BackendEntry:
        """Register ``backend`` (replacing one with the same id) and start polling it.

        The first scrape is awaited so that a freshly registered backend can take work at
        once instead of after one polling interval.
        """
        old = self._entries.get(backend.id)
        if old is not None:
            await self._retire(old)
        load = BackendLoad(max_in_flight=backend.max_in_flight)
        poller = MetricsPoller(
            backend,
            load,
            interval=self._poll_interval,
            on_update=self._on_update,
            unhealthy_after_failures=self._unhealthy_after_failures,
        )
        entry = BackendEntry(backend, load, poller, PrefixCache(self._prefix_cache_blocks))
        entry.idle.set()
        await poller.poll_once()
        entry.task = asyncio.create_task(poller.run(), name=f"poll-{backend.id}")
        self._entries[backend.id] = entry
        self._on_update(None)
        return entry

    async def remove(self, backend_id: str) -> BackendEntry | None:
        """Unregister ``backend_id``: no new work; requests in flight run to completion."""
        entry = self._entries.pop(backend_id, None)
        if entry is not None:
            await self._retire(entry)
            self._on_update(None)
        return entry

    async def close(self) -> None:
        """Stop every poller and close every client now, in-flight work or not."""
        entries = [*self._entries.values(), *self._closing.values()]
        self._entries.clear()
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for entry in entries:
            await self._stop_polling(entry)
            # Also for a backend whose close-when-idle task was cancelled before it ran.
            await entry.backend.aclose()

    async def _retire(self, entry: BackendEntry) -> None:
        """Stop polling ``entry`` and close its client once its in-flight work is done."""
        await self._stop_polling(entry)
        if entry.load.in_flight == 0:
            await entry.backend.aclose()
            return
        task = asyncio.create_task(self._close_when_idle(entry))
        self._closing[task] = entry
        task.add_done_callback(self._closing.pop)

    @staticmethod
    async def _stop_polling(entry: BackendEntry) -> None:
        entry.load.draining = True
        if entry.task is not None:
            entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task

    @staticmethod
    async def _close_when_idle(entry: BackendEntry) -> None:
        try:
            await entry.idle.wait()
        finally:
            await entry.backend.aclose()
