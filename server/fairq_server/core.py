"""The scheduling core: wires backends (adapters, pollers) to the dispatcher.

``backends/`` knows nothing of scheduling; here its outputs become the dispatcher's events:
each poller reports its scrapes to the dispatcher, and the dispatcher reads backend streams
through its launcher. The core owns the lifecycles the dispatcher does not: poller tasks, and
closing a backend's connections once it has left and gone idle.

The scheduling part of the configuration (tiers, ``[scheduler]``, the plugins) has one owner
at run time, the dispatcher: the core reads it there (:attr:`FairqCore.policies`, the pollers'
intervals), and a reload becomes the core's :attr:`FairqCore.config` only once the dispatcher
has applied it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fairq_server.backends.base import Backend
from fairq_server.backends.build import make_backend
from fairq_server.backends.credentials import refuse_unserved
from fairq_server.backends.http_reading import ReadLimits
from fairq_server.backends.poller import MetricsPoller
from fairq_server.backends.registrations import (
    FileRegistrations,
    Registrations,
    backend_from_json,
    backend_to_json,
)
from fairq_server.config.schema import BackendConfig, Config, ConfigError
from fairq_server.errors import (
    BackendError,
    BackendFailure,
    InvalidRequestError,
    QueueFullError,
    SchedulerError,
)
from fairq_server.names import escape
from fairq_server.port import Submission, Submitted
from fairq_server.runtime.loop_monitor import LoopMonitor
from fairq_server.runtime.loop_tools import LoopTools
from fairq_server.runtime.supervisor import stop_task, supervise
from fairq_server.scheduling.attempt_stream import StreamLauncher
from fairq_server.scheduling.backend_state import BackendState, Health
from fairq_server.scheduling.backend_view import view_of
from fairq_server.scheduling.dispatcher import Dispatcher
from fairq_server.scheduling.outbox import Outbox
from fairq_server.scheduling.policies import Policies
from fairq_server.scheduling.queue_view import BackendView, QueueView
from fairq_server.scheduling.ticket import Carrier, Ticket
from fairq_server.telemetry import Telemetry
from fairq_server.tenancy.factory import build_entitlement

if TYPE_CHECKING:
    from fairq_server.cluster.node import ClusterNode

__all__ = ["FairqCore"]

log = logging.getLogger(__name__)


@dataclass
class _Polled:
    poller: MetricsPoller
    task: asyncio.Task[None]


class FairqCore:
    """Owns the dispatcher, the backend adapters and their pollers.

    Args:
        config: the configuration.
        telemetry: metrics sink (a fresh registry if None).
        on_health: told False when scheduling stops working (the dispatcher loop crashed)
            and True when it works again.
        tools: the event loop's clock, time-slicer and pace, handed to every part that
            shares the loop (a fresh set on the real clock if None).

    """

    def __init__(
        self,
        config: Config,
        telemetry: Telemetry | None = None,
        on_health: Callable[[bool], None] = lambda serving: None,
        tools: LoopTools | None = None,
    ) -> None:
        self._config = config
        #: The loop's clock, share and pace: the doors, outboxes, readers and the loop
        #: monitor all use these (docs/design/runtime.md).
        self.tools = tools if tools is not None else LoopTools()
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.tier_names = tuple(t.name for t in config.tiers)
        self.cluster: ClusterNode | None = None
        window = config.scheduler.stream_coalesce_seconds
        launcher = StreamLauncher(lambda event: self.dispatcher.post(event), window, self.tools)
        book = None
        if config.cluster is not None:
            # Imported only here: one process without [cluster] never loads the Redis client.
            from fairq_server.cluster.launcher import ClusterLauncher
            from fairq_server.cluster.node import ClusterNode

            self.cluster = ClusterNode(config.cluster, self.telemetry.registry)
            cluster_launcher = ClusterLauncher(
                lambda event: self.dispatcher.post(event), window,
                self.cluster, lambda: self.dispatcher.settings, lambda: self.dispatcher.now(),
                self.tools,
            )  # fmt: skip
            launcher, book = cluster_launcher, cluster_launcher.quota  # a cluster counts in Redis
        # Fail at start-up on unknown policy names, not at the first request.
        self.dispatcher = Dispatcher(
            config.tiers, config.scheduler, self.telemetry, self._policies(config), launcher,
            on_health=on_health, entitlement=build_entitlement(config, self.telemetry, book),
        )  # fmt: skip
        if self.cluster is not None:
            self.cluster.attach(self.dispatcher.post, lambda: [b.id for b in self.backends()])
        # Where RPC registrations outlive this process: Redis in a cluster, else state_file.
        self.registrations: Registrations | None = None
        if self.cluster is not None:
            from fairq_server.cluster.shared_registrations import RedisRegistrations

            prefix = self.cluster.config.key_prefix
            self.registrations = RedisRegistrations(self.cluster.client, prefix)
        elif config.state_file:
            self.registrations = FileRegistrations(config.state_file)
        self._stored: dict[str, str] = {}  # registrations applied here, as stored
        self._watcher: asyncio.Task[None] | None = None
        self._polled: dict[str, _Polled] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._adapters: set[Backend] = set()
        self._loop_monitor = LoopMonitor(
            self.telemetry.loop_lag.observe, self.tools, report=self.telemetry.loop_sample
        )

    @property
    def config(self) -> Config:
        """The configuration in use (its scheduling part as the dispatcher applied it)."""
        return self._config

    def use_teams(self, config: Config) -> None:
        """Resolve teams' weights by ``config``'s teams (the file's merged with the store's)."""
        self._config = replace(self._config, teams=config.teams)

    @property
    def policies(self) -> Policies:
        """The plugins in use (the dispatcher's)."""
        return self.dispatcher.policies

    async def start(self) -> None:
        """Start the dispatcher, measure event-loop lag, register the configured backends."""
        self._loop_monitor.start()
        if self.cluster is not None:
            await self.cluster.start()
        self.dispatcher.start()
        for cfg in self.config.backends:
            await self.register_backend(cfg)
        await self._restore_registrations()

    async def close_queues(self) -> None:
        """Stop dispatching and answer every queued request UNAVAILABLE."""
        await self.dispatcher.close()

    async def close(self) -> None:
        """Close the queues, stop polling and close backend connections (aborting streams)."""
        if self._watcher is not None:
            await stop_task(self._watcher)
        await self.close_queues()
        for backend_id in list(self._polled):
            await self._stop_polling(backend_id)
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for adapter in list(self._adapters):
            await adapter.aclose()
        self._adapters.clear()
        await self._loop_monitor.stop()
        if self.cluster is not None:
            await self.cluster.close()

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
        try:
            policies = self._policies(config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        s, o = config.scheduler, old.scheduler
        queue_plugins = ("fairness", "fairness_options", "ordering", "ordering_options")
        rebuild = any(getattr(s, k) != getattr(o, k) for k in queue_plugins)
        # Build every new backend before changing anything: a file that cannot be applied
        # whole is refused whole.
        added: list[tuple[BackendConfig, Backend]] = []
        try:
            for cfg in config.backends:
                if cfg not in old.backends or self.dispatcher.backend(cfg.id) is None:
                    added.append((cfg, self._make_backend(cfg, config, from_rpc=False)))
        except InvalidRequestError as exc:
            for _, backend in added:
                await backend.aclose()
            raise ConfigError(f"backends: {exc}") from None
        removed = {b.id for b in old.backends} - {b.id for b in config.backends}
        kept = {b.id for b in self.dispatcher.backends()} - removed
        total = len(kept | {cfg.id for cfg, _ in added})
        if total > config.admin.max_backends:
            for _, backend in added:
                await backend.aclose()
            raise ConfigError(
                f"backends: {total} would be registered; admin.max_backends is "
                f"{config.admin.max_backends}"
            )
        # Nothing has changed yet; from here on the whole file applies. The dispatcher owns
        # the scheduling part: it applies it, then the rest of the process follows.
        await self.dispatcher.reconfigure(config.tiers, s, policies, rebuild=rebuild)
        self._config = config
        for polled in self._polled.values():
            polled.poller.interval = s.poll_interval_seconds  # from its next scrape on
            polled.poller.max_backoff = s.max_poll_backoff_seconds
            polled.poller.timeout = s.scrape_timeout_seconds
        wanted = {b.id: b for b in config.backends}
        for backend_id in [b.id for b in old.backends if b.id not in wanted]:
            await self.deregister_backend(backend_id, drain=False)
        for cfg, backend in added:
            await self.register_backend(cfg, backend=backend)

    def _policies(self, config: Config) -> Policies:
        policies = Policies.from_config(config.scheduler)
        if self.cluster is None:
            return policies
        from fairq_server.cluster.fairness import shared_policies

        slack = self.cluster.config.fairness_slack
        return shared_policies(policies, slack, self.cluster.fair.wake)

    def live_requests(self) -> int:
        """Count the requests queued or running, over all models."""
        return self.dispatcher.live_requests()

    def backend(self, backend_id: str) -> BackendState | None:
        """Return the state of registered backend ``backend_id``."""
        return self.dispatcher.backend(backend_id)

    def backends(self) -> list[BackendState]:
        """Return the states of every registered backend."""
        return self.dispatcher.backends()

    def known_models(self) -> set[str]:
        """Return every model a backend is registered for, up or down."""
        return self.dispatcher.models()

    def refusal(self, user: str, team: str | None, model: str) -> SchedulerError | None:
        """Return the quota or budget refusal ``user`` meets for ``model`` now, if any."""
        entitlement = self.dispatcher.entitlement
        if entitlement is None or not entitlement.active:
            return None
        return entitlement.refusal(user, team, model)

    def token_prompt_refusers(self, model: str) -> list[str]:
        """Return the kinds of ``model``'s backends that do not take token-id prompts.

        Every backend of the model must take them: the dispatcher may pick any of them.
        """
        serving = [b.backend for b in self.backends() if model in b.backend.models]
        return sorted({b.kind for b in serving if not b.token_prompts})

    def submit(self, submission: Submission) -> Ticket:
        """Queue a door's request as a ticket (see :meth:`Dispatcher.submit`)."""
        return self._submit(submission, None)

    def submit_carried(self, submission: Submission, carrier: Carrier) -> Ticket:
        """Queue a request whose bytes ``carrier`` carries (the ext_proc door's).

        The dispatcher picks its backend and holds the slot as for any request; its attempt
        reads the carrier's stream instead of opening the backend's.
        """
        return self._submit(submission, carrier)

    def _submit(self, submission: Submission, carrier: Carrier | None) -> Ticket:
        config = self.config
        ticket = Ticket(
            request=submission.request,
            user=submission.user,
            tier=submission.tier,
            weight=submission.weight,
            team=submission.team,
            team_weight=submission.team_weight,
            group=submission.group,
            prompt_tokens=submission.prompt_tokens,
            max_tokens=submission.max_tokens,
            arrival=submission.arrival,
            prefix=submission.prefix,
            outbox=Outbox(
                config.limits.max_unread_chars,
                config.scheduler.stream_coalesce_seconds,
                self.tools.pace,
                self.tools.clock,
                relay=submission.request.relay_chunks,
            ),
            carrier=carrier,
        )
        self.dispatcher.submit(ticket)
        return ticket

    def cancel(self, submitted: Submitted) -> None:
        """Take a ticket out of the queue or abort its backend request (idempotent)."""
        if not isinstance(submitted, Ticket):
            raise TypeError(f"not a ticket of this core: {submitted!r}")
        self.dispatcher.cancel(submitted)

    def queue_view(self) -> QueueView:
        """Return queue depths, queued users and each backend's status and gate, now."""
        config = self.config
        now = time.monotonic()
        stale_after = config.scheduler.stale_after_seconds
        view = QueueView(tiers=self.tier_names)
        for model in sorted(self.dispatcher.model_states(), key=lambda m: m.name):
            queue = model.queue
            view.models[model.name] = [len(tier) for tier in queue.tiers]
            users: set[str] = set()
            for tier in queue.tiers:
                users.update(tier.users())
            view.queued_users[model.name] = len(users)
            for user in users:
                view.user_queued[user] = view.user_queued.get(user, 0) + queue.user_len(user)
        gate = self.policies.gate
        for backend in sorted(self.backends(), key=lambda b: b.backend.id):
            # The gate is a pure check: asking it here changes nothing, counts no refusal.
            gates = [gate.check(backend, tier, now, stale_after).value for tier in config.tiers]
            view.backends.append((view_of(backend, stale_after, now), gates))
        return view

    async def register_remote(self, cfg: BackendConfig) -> BackendView:
        """Register a backend asked for over the Admin API (held to ``admin``'s allowlist)."""
        state = await self.register_backend(cfg, from_rpc=True)
        return view_of(state, self.config.scheduler.stale_after_seconds, time.monotonic())

    def backend_views(self) -> list[BackendView]:
        """Return every registered backend as plain values, now."""
        now, stale_after = time.monotonic(), self.config.scheduler.stale_after_seconds
        return [view_of(b, stale_after, now) for b in self.backends()]

    def served_models(self) -> set[str]:
        """Return the models some backend serves now: one registered for it and not down.

        A backend that is down (its scrapes fail, or its ``/v1/models`` does not list a model
        it is registered for) serves nothing; a request for a model whose every backend is
        down is refused UNAVAILABLE, so such a model is not offered either. A backend not
        yet scraped counts as serving (it has not failed).
        """
        return {m for b in self.backends() if b.health is not Health.DOWN for m in b.backend.models}

    async def _restore_registrations(self) -> None:
        """Register what earlier RPCs stored; in a cluster, follow the shared registry."""
        if self.registrations is None:
            return
        from_file = {b.id for b in self.config.backends}
        if self.cluster is not None:
            from fairq_server.cluster.shared_registrations import RedisRegistrations, watch

            assert isinstance(self.registrations, RedisRegistrations)
            self._watcher = asyncio.create_task(
                watch(self.cluster.client, self.registrations, self._reconcile), name="registry"
            )
            return
        for cfg in await self.registrations.load():
            if cfg.id not in from_file:
                await self._reconcile_one(cfg.id, backend_to_json(cfg))

    async def _reconcile(self, stored: dict[str, str]) -> None:
        """Match this replica's RPC-registered backends to the shared registry."""
        from_file = {b.id for b in self.config.backends}
        for backend_id, text in stored.items():
            if backend_id not in from_file and self._stored.get(backend_id) != text:
                await self._reconcile_one(backend_id, text)
        for backend_id in [b for b in self._stored if b not in stored]:
            del self._stored[backend_id]
            await self.deregister_backend(backend_id, drain=False, persist=False)

    async def _reconcile_one(self, backend_id: str, text: str) -> None:
        try:
            await self.register_backend(backend_from_json(text), from_rpc=True, persist=False)
        except Exception as exc:  # the backend may be down now: tried again at the next read
            log.warning("stored backend %s not registered: %s", backend_id, exc)
            return
        self._stored[backend_id] = text

    async def register_backend(
        self, cfg: BackendConfig, *, backend: Backend | None = None, from_rpc: bool = False,
        persist: bool = True,
    ) -> BackendState:  # fmt: skip
        """Validate and register a backend (replacing one with the same id).

        The first scrape is done before returning, so a freshly registered backend can take
        work at once. Backends registered over RPC must point inside
        ``admin.backend_allowlist``; those in the configuration file are the operator's own.
        """
        if backend is None:
            backend = self._make_backend(cfg, self.config, from_rpc=from_rpc)
        limit = self.config.admin.max_backends
        if self.dispatcher.backend(backend.id) is None and len(self.dispatcher.backends()) >= limit:
            await backend.aclose()
            raise QueueFullError(f"{limit} backends are registered, the limit (admin.max_backends)")
        if from_rpc:
            await refuse_unserved(backend)
        await self._stop_polling(backend.id)
        old = self.dispatcher.backend(backend.id)
        self._adapters.add(backend)
        backend.loop_share = self.tools.share  # its reads share the loop with the rest
        state = await self.dispatcher.add_backend(backend)
        if old is not None:
            self._close_when_idle(old)
        poller = MetricsPoller(
            backend,
            interval=self.dispatcher.config.poll_interval_seconds,
            max_backoff=self.dispatcher.config.max_poll_backoff_seconds,
            on_sent=self.dispatcher.scrape_sent,
            on_result=self.dispatcher.scrape_landed,
            timeout=self.dispatcher.config.scrape_timeout_seconds,
        )
        try:
            await poller.poll_once()
            await self.dispatcher.sync()
        except BaseException:
            # Cancelled (the caller's deadline) before the first scrape was in: the caller
            # was told it failed, so nothing of it may stay registered or open.
            undo = asyncio.ensure_future(self._undo_registration(backend.id))
            self._closing.add(undo)
            undo.add_done_callback(self._closing.discard)
            raise
        task = asyncio.create_task(self._poll(poller), name=f"poll-{backend.id}")
        self._polled[backend.id] = _Polled(poller, task)
        log.info(
            "registered backend %s (%s) for %s",
            backend.id, backend.kind, [escape(m, 100) for m in backend.models],
        )  # fmt: skip
        if from_rpc and persist and self.registrations is not None:
            self._stored[cfg.id] = backend_to_json(cfg)
            await self.registrations.put(cfg)
        return state

    async def _undo_registration(self, backend_id: str) -> None:
        state = await self.dispatcher.remove_backend(backend_id)
        if state is not None:
            self._close_when_idle(state)

    @staticmethod
    def _make_backend(cfg: BackendConfig, config: Config, *, from_rpc: bool) -> Backend:
        s = config.scheduler
        return make_backend(
            cfg,
            timeout=s.backend_timeout_seconds,
            allowlist=config.admin.backend_allowlist if from_rpc else None,
            read_limits=ReadLimits(s.max_metrics_bytes, s.max_error_body_bytes),
        )

    async def deregister_backend(
        self, backend_id: str, *, drain: bool, persist: bool = True
    ) -> bool:
        """Remove a backend; with ``drain``, return once its in-flight requests are done.

        With ``persist``, a stored RPC registration is forgotten too (every replica's).
        """
        if persist and self.registrations is not None:
            self._stored.pop(backend_id, None)
            await self.registrations.delete(backend_id)
        await self._stop_polling(backend_id)
        state = await self.dispatcher.remove_backend(backend_id)
        if state is None:
            return False
        self._close_when_idle(state)
        if drain:
            await state.idle.wait()
        log.info("deregistered backend %s", backend_id)
        return True

    async def _poll(self, poller: MetricsPoller) -> None:
        backend_id = poller.backend.id

        def crashed(exc: BaseException) -> None:
            # Whatever broke the poller, its backend's metrics stop: say so at once.
            error = BackendError(f"metrics poller failed: {exc!r}", BackendFailure.FAILED)
            self.dispatcher.scrape_landed(backend_id, error)

        await supervise(f"metrics poller of {backend_id}", poller.run, on_crash=crashed)

    async def _stop_polling(self, backend_id: str) -> None:
        polled = self._polled.pop(backend_id, None)
        if polled is not None:
            await stop_task(polled.task)

    def _close_when_idle(self, state: BackendState) -> None:
        """Close a departed backend's adapter and drop its metric series once it is idle.

        Without the second, a fleet that churns backend ids would grow fairq's series for good.
        """

        async def close() -> None:
            try:
                await state.idle.wait()
            finally:
                self._adapters.discard(state.backend)
                await state.backend.aclose()
            if self.dispatcher.backend(state.id) is None:  # not re-registered meanwhile
                # Its last request has ended, so nothing writes its series any more.
                self.telemetry.forget_backend(state.id)

        task = asyncio.create_task(close(), name=f"close-{state.id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
