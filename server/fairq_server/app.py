"""The fairq process, assembled above both doors.

:class:`FairqServer` wires the configuration to the scheduling core (dispatcher, backends,
cluster), the gRPC door (:mod:`fairq_server.doors.grpc`), the OpenAI-compatible HTTP door
(:mod:`fairq_server.doors.http`), the request log, the metrics endpoint and the collector, and owns
their order at start, reload and stop. The doors know nothing of each other or of this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from prometheus_client import start_http_server

from fairq_server.config.schema import Config
from fairq_server.console import build_console
from fairq_server.core import FairqCore
from fairq_server.doors.access_log import RequestLog
from fairq_server.doors.grpc.server import GrpcDoor
from fairq_server.doors.http.server import HttpDoor
from fairq_server.doors.listening import listening
from fairq_server.errors import ConfigError
from fairq_server.identity.auth import Authenticator
from fairq_server.runtime.collector import Collector
from fairq_server.store.service import Store
from fairq_server.telemetry import Telemetry
from fairq_server.tenancy.books.persisted import keep_state
from fairq_server.tenancy.managed import ManagedEntitlement

if TYPE_CHECKING:
    from fairq_server.doors.extproc.door import ExtprocDoor

__all__ = ["FairqServer"]

log = logging.getLogger(__name__)


class FairqServer:
    """A running fairq: the core, the gRPC door, the HTTP door and the metrics endpoint.

    Use as an async context manager, or call :meth:`start` and :meth:`stop`::

        async with FairqServer(config) as server:
            print(server.port)

    Attributes:
        config: the configuration in force (replaced by :meth:`reload`).
        core: the scheduling core both doors share.
        auth: the authenticator both doors share.
        request_log: where finished requests are reported.
        port: the gRPC port once started.
        http_port: the HTTP door's port once started (0 without ``[http]``).
        metrics_port: the metrics endpoint's port once started (0 without it).

    """

    def __init__(self, config: Config, telemetry: Telemetry | None = None) -> None:
        self.config = config
        self.core = FairqCore(config, telemetry, on_health=self._scheduling_health)
        self.auth = Authenticator(config.keys, self.core.tier_names, config.jwt)
        self.store: Store | None = None
        if config.store is not None:
            replica = config.cluster.replica_id if config.cluster else _process_name()
            registry = self.core.telemetry.registry
            # The teams in force: the file's merged with the store's (core.use_teams).
            self.store = Store(config.store, config.state_file, config.prices,
                               self.core.tier_names, replica, registry,
                               lambda: [t.name for t in self.core.config.teams])  # fmt: skip
        self.managed: ManagedEntitlement | None = None  # teams and limits set live (a store)
        self.request_log = RequestLog(config.access_log, usage=self.store)
        self.port = 0
        self.metrics_port = 0
        self.http_port = 0
        # Serving requests (the HTTP door's /health; gRPC health keeps its own): from the
        # core's start until the dispatcher loop crashes (it restarts) or the process stops.
        self._serving = False
        self._grpc = GrpcDoor(config, self.core, self.auth, self.request_log, self.store)
        self._http: HttpDoor | None = None
        self._extproc: ExtprocDoor | None = None
        self.extproc_port = 0
        self._metrics_http: object | None = None
        self._collector = Collector(
            self.core.live_requests,
            lambda generation, seconds: self.core.telemetry.gc_pause.labels(
                str(generation)
            ).observe(seconds),
            clock=self.core.tools.clock,
        )

    def _scheduling_health(self, serving: bool) -> None:
        self._serving = serving
        self._grpc.scheduling_health(serving)

    async def __aenter__(self) -> FairqServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(grace=1.0)

    async def start(self) -> None:
        """Register configured backends, bind the ports and start serving."""
        if self.store is not None:
            await self.store.start()
            self.auth.add_source(self.store.keys)
            self.managed = ManagedEntitlement(
                self.store.entitlement, self.store.audit, lambda: self.config, self._served
            )
            self._grpc.managed = self.managed
            self.store.entitlement.on_change = lambda stored: self._apply_entitlement()
            self._apply_entitlement()
            await keep_state(self.core.dispatcher.entitlement, self.store.limits, time.time())
        await self.core.start()
        self._serving = True
        await self.auth.start()
        await self._grpc.start()
        self.port = self._grpc.port
        if self.config.http.listen:
            console = None
            if self.config.console.enabled:
                console = build_console(
                    self.core, self.auth, self.request_log.recent, self.store, self.managed
                )
            self._http = HttpDoor(
                self.core,
                self.auth,
                self.config.http.listen,
                self.request_log,
                console,
                serving=lambda: self._serving,
            )
            with listening("http.listen", self.config.http.listen):
                await self._http.start()
            self.http_port = self._http.port
        if self.config.extproc.listen:
            # Imported only here: a process without the door never loads Envoy's stubs.
            from fairq_server.doors.extproc.door import ExtprocDoor

            replica = self.config.cluster.replica_id if self.config.cluster else "fairq"
            self._extproc = ExtprocDoor(self.core, self.auth, self.request_log, replica)
            with listening("extproc.listen", self.config.extproc.listen):
                await self._extproc.start(self.config.extproc.listen)
            self.extproc_port = self._extproc.port
        if self.config.metrics_listen:
            host, _, port = self.config.metrics_listen.rpartition(":")
            with listening("metrics_listen", self.config.metrics_listen):
                httpd, _thread = start_http_server(
                    int(port), addr=host or "127.0.0.1", registry=self.core.telemetry.registry
                )
            self._metrics_http = httpd
            self.metrics_port = httpd.server_port
        # Last: what exists now lives as long as the server and is frozen out of collections.
        self._collector.start()
        log.info("fairq listening on %s (port %d)", self.config.listen, self.port)
        _warn_open_mode(self.config, self.auth.open_mode)

    async def reload(self, config: Config) -> None:
        """Apply a new configuration without dropping queued or running requests.

        See :meth:`FairqCore.reconfigure` for what may change. Listening addresses are kept;
        a change to them is logged and ignored.

        Raises:
            ConfigError: the configuration cannot be applied live; nothing was changed.

        """
        if (config.listen, config.metrics_listen, config.http.listen) != (
            self.config.listen,
            self.config.metrics_listen,
            self.config.http.listen,
        ):
            log.warning("listen addresses cannot change on reload; restart to apply them")
        try:
            keys = self.auth.prepare(config.keys)
        except ValueError as exc:  # parse_config checks digests; this is the backstop
            raise ConfigError(f"keys: {exc}") from None
        jwt = self.auth.prepare_jwt(config.jwt)
        # Everything that can refuse the file has run; from here on it is applied whole.
        # The core and the limit book get the file's entries merged with the store's at once.
        effective, labels = self._effective(config)
        await self.core.reconfigure(effective)
        if self.core.dispatcher.entitlement is not None:  # quotas, budgets and their prices
            self.core.dispatcher.entitlement.configure(
                effective.quotas, effective.budgets, effective.prices, labels
            )
        self.auth.install(keys)
        await self.auth.install_jwt(jwt)
        self.request_log.set_enabled(config.access_log)
        if self.store is not None:
            if config.store != self.config.store:
                log.warning("[store] cannot change on reload; restart to apply it (prices do)")
            self.store.reconfigure(config.prices, self.core.tier_names)
        self.config = config
        _warn_open_mode(config, self.auth.open_mode)
        log.info("configuration reloaded")

    def _served(self) -> set[str]:
        """Return the models the registered backends serve (the file's are added)."""
        return {m for b in self.core.backends() for m in b.backend.models}

    def _effective(self, config: Config) -> tuple[Config, list[str]]:
        """Return ``config`` with the store's teams, quotas and budgets merged in, and labels.

        The labels name where each quota and budget comes from, for refusals' messages.
        """
        if self.managed is None:
            return config, []
        merged = self.managed.effective(config)
        effective = replace(config, teams=merged.teams, quotas=merged.quotas,
                            budgets=merged.budgets)  # fmt: skip
        return effective, merged.labels()

    def _apply_entitlement(self) -> None:
        """Put the store's entries in force (at start, and when any replica changed them)."""
        effective, labels = self._effective(self.config)
        self.core.use_teams(effective)
        if self.core.dispatcher.entitlement is not None:
            self.core.dispatcher.entitlement.configure(
                effective.quotas, effective.budgets, effective.prices, labels
            )

    async def stop(self, grace: float) -> None:
        """Stop accepting, answer queued requests UNAVAILABLE, let running ones finish.

        Running streams get ``grace`` seconds before they are cancelled.
        """
        self._serving = False
        await self._grpc.not_serving()
        await asyncio.gather(
            self.core.close_queues(), self._grpc.stop(grace), self._stop_http(grace),
            self._stop_extproc(grace),
        )  # fmt: skip
        await self.core.close()
        if self.store is not None:  # every request has ended: its row is in the buffer
            await self.store.close()
        await self.auth.close()
        await self._collector.stop()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()  # type: ignore[attr-defined]

    async def _stop_extproc(self, grace: float) -> None:
        if self._extproc is not None:
            await self._extproc.stop(grace)

    async def _stop_http(self, grace: float) -> None:
        """Give running HTTP streams ``grace`` seconds, then close the door."""
        if self._http is None:
            return
        # Queued requests are answered by close_queues; running ones end with their backend.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.gather(*(b.idle.wait() for b in self.core.backends()))
        await self._http.stop()

    async def wait_for_termination(self) -> None:
        """Block until the gRPC door stops."""
        await self._grpc.wait_for_termination()


def _process_name() -> str:
    """Return this process's name in the usage ledger outside a cluster: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _warn_open_mode(config: Config, open_mode: bool) -> None:
    """Say loudly that without keys every caller is trusted, and an admin."""
    if not open_mode:
        return
    log.warning(
        "OPEN MODE: no [[keys]] are configured, so fairq trusts every caller: the "
        "x-fairq-user metadata names the user, every tier is allowed, every caller may call "
        "Admin (register, deregister backends), and API keys sent are ignored. Add [[keys]] "
        "(`fairq keys create --file --user NAME`) before exposing %s beyond this machine.",
        config.listen,
    )
