"""The scheduling core: backends, one dispatcher per model, and their wiring."""

from __future__ import annotations

import asyncio
import logging

from fairq_server.backends.base import Backend
from fairq_server.backends.poller import MetricsPoller
from fairq_server.backends.registry import BackendEntry, BackendPool, make_backend
from fairq_server.config import BackendConfig, Config, ConfigError
from fairq_server.errors import ModelNotFoundError, NoBackendError
from fairq_server.loop_monitor import LoopMonitor
from fairq_server.scheduling.dispatcher import Dispatcher
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.registry import make_fairness, make_ordering
from fairq_server.telemetry import Telemetry

__all__ = ["FairqCore"]

log = logging.getLogger(__name__)


class FairqCore:
    """Owns the backend pool and a dispatcher for every model some backend serves.

    A model's dispatcher and queue outlive its backends: when the last backend of a model
    leaves, queued requests stay queued until another one registers.
    """

    def __init__(self, config: Config, telemetry: Telemetry | None = None) -> None:
        self.config = config
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.tier_names = tuple(t.name for t in config.tiers)
        # Fail at start-up on unknown policy names, not at the first request.
        make_fairness(config.scheduler.fairness)
        self._ordering = make_ordering(config.scheduler.ordering)
        self.pool = BackendPool(
            poll_interval=config.scheduler.poll_interval_seconds,
            on_update=self._on_scrape,
            prefix_cache_blocks=config.scheduler.prefix_cache_blocks,
            unhealthy_after_failures=config.scheduler.unhealthy_after_failures,
        )
        self._dispatchers: dict[str, Dispatcher] = {}
        self._loop_monitor = LoopMonitor(self.telemetry.loop_lag.observe)

    async def start(self) -> None:
        """Start measuring event-loop lag and register the configured backends."""
        self._loop_monitor.start()
        for cfg in self.config.backends:
            await self.register_backend(cfg)

    async def close_queues(self) -> None:
        """Stop dispatching and answer every queued request UNAVAILABLE."""
        await asyncio.gather(*(d.close() for d in self._dispatchers.values()))

    async def close(self) -> None:
        """Close the queues, stop polling and close backend connections."""
        await self.close_queues()
        await self.pool.close()
        await self._loop_monitor.stop()

    async def reconfigure(self, config: Config) -> None:
        """Apply a reloaded configuration without dropping queued or running requests.

        Tier names and order, ``listen`` and ``metrics_listen`` cannot change at run time.
        Policies, thresholds, caps and prefix settings apply at once; a change of fairness
        or ordering policy rebuilds the queues (tickets keep their arrival order; fairness
        counters start afresh). Backends are added, replaced or removed to match the file;
        removed ones finish their in-flight requests.

        Raises:
            ConfigError: the new configuration changes something that cannot change live.

        """
        old = self.config
        if tuple(t.name for t in config.tiers) != self.tier_names:
            raise ConfigError("tiers cannot be renamed, added or reordered at run time")
        make_fairness(config.scheduler.fairness)
        ordering = make_ordering(config.scheduler.ordering)
        rebuild = (config.scheduler.fairness, config.scheduler.ordering) != (
            old.scheduler.fairness,
            old.scheduler.ordering,
        )
        self.config = config
        self._ordering = ordering
        self.pool.set_polling(
            config.scheduler.poll_interval_seconds, config.scheduler.unhealthy_after_failures
        )
        for dispatcher in self._dispatchers.values():
            dispatcher.reconfigure(
                config.tiers, config.scheduler, self._new_queue() if rebuild else None
            )
        wanted = {b.id: b for b in config.backends}
        for backend_id in [b.id for b in old.backends if b.id not in wanted]:
            await self.deregister_backend(backend_id, drain=False)
        for cfg in config.backends:
            if cfg not in old.backends or self.pool.get(cfg.id) is None:
                await self.register_backend(cfg)

    def live_requests(self) -> int:
        """Count the requests queued or running on a registered backend, over all models."""
        queued = sum(len(d.queue) for d in self._dispatchers.values())
        return queued + sum(e.load.in_flight for e in self.pool.entries())

    def _new_queue(self) -> ModelQueue:
        return ModelQueue(
            len(self.config.tiers),
            lambda: make_fairness(self.config.scheduler.fairness),
            self._ordering,
        )

    def dispatcher(self, model: str) -> Dispatcher:
        """Return the dispatcher of ``model``.

        Raises:
            ModelNotFoundError: no backend serves ``model``.
            NoBackendError: every backend of ``model`` is failing its health checks.

        """
        entries = self.pool.for_model(model)
        if not entries:
            known = ", ".join(sorted(self.pool.models())) or "none"
            raise ModelNotFoundError(f"model '{model}' is not served here; models: {known}")
        if not any(e.healthy and not e.load.draining for e in entries):
            raise NoBackendError(f"no healthy backend serves model '{model}'")
        return self._dispatchers[model]

    async def register_backend(
        self, cfg: BackendConfig, *, backend: Backend | None = None, from_rpc: bool = False
    ) -> BackendEntry:
        """Validate and register a backend (replacing one with the same id).

        Backends registered over RPC must point inside ``admin.backend_allowlist``; those in
        the configuration file are the operator's own choice.
        """
        if backend is None:
            backend = make_backend(
                cfg,
                timeout=self.config.scheduler.backend_timeout_seconds,
                allowlist=self.config.admin.backend_allowlist if from_rpc else None,
            )
        for model in backend.models:
            if model not in self._dispatchers:
                dispatcher = Dispatcher(
                    model, self._new_queue(), self.config.tiers, self.pool, self.config.scheduler,
                    self.telemetry,
                )  # fmt: skip
                dispatcher.start()
                self._dispatchers[model] = dispatcher
        entry = await self.pool.add(backend)
        log.info("registered backend %s (%s) for %s", backend.id, backend.kind, backend.models)
        return entry

    async def deregister_backend(self, backend_id: str, *, drain: bool) -> bool:
        """Remove a backend; with ``drain``, return once its in-flight requests are done."""
        entry = await self.pool.remove(backend_id)
        if entry is None:
            return False
        if drain:
            await entry.idle.wait()
        log.info("deregistered backend %s", backend_id)
        return True

    def _on_scrape(self, poller: MetricsPoller | None) -> None:
        if poller is not None:
            t, bid = self.telemetry, poller.backend.id
            t.backend_healthy.labels(bid).set(1 if poller.healthy else 0)
            if poller.consecutive_failures:  # this update is a failed scrape
                t.scrape_failures.labels(bid).inc()
            snap = poller.load.snapshot
            if snap is not None:
                t.backend_waiting.labels(bid).set(snap.waiting)
                t.backend_running.labels(bid).set(snap.running)
                t.backend_tpot.labels(bid).set(snap.tpot_seconds or 0.0)
        for dispatcher in self._dispatchers.values():
            dispatcher.wake()
