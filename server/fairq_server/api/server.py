"""The gRPC server: Scheduler, Admin, health and reflection on one port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.api.access_log import RequestLog
from fairq_server.api.admin import AdminServicer
from fairq_server.api.discovery import HealthServicer, enable_reflection
from fairq_server.api.receive import RequestGuard
from fairq_server.api.scheduler import SchedulerServicer
from fairq_server.auth import Authenticator
from fairq_server.collector import Collector
from fairq_server.config import Config, ConfigError, TlsConfig
from fairq_server.core import FairqCore
from fairq_server.http import HttpDoor
from fairq_server.store.service import Store
from fairq_server.telemetry import Telemetry

__all__ = ["FairqServer", "server_credentials", "server_options"]

log = logging.getLogger(__name__)

_SERVICES = (
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)


# gRPC core cancels a call the application has not accepted (requested) within
# grpc.server_max_unrequested_time_in_server seconds, 30 by default. A burst, or a stall of the
# event loop, can keep calls that long in gRPC's own pending queue; fairq's queue (with its TTL
# and caps) is the place that should decide how long a request may wait, so the bound is kept
# well above the TTL.
UNREQUESTED_MIN_SECONDS = 3600
_INT_ARG_MAX = 2**31 - 1  # gRPC channel arguments are C ints
KEEPALIVE_SECONDS = 60
KEEPALIVE_TIMEOUT_SECONDS = 20
CONNECTION_IDLE_SECONDS = 300


def server_options(config: Config) -> list[tuple[str, int]]:
    """Return the options of fairq's ``grpc.aio`` server for ``config``.

    ``grpc.server_max_unrequested_time_in_server`` (seconds) is twice the queue TTL, at least
    :data:`UNREQUESTED_MIN_SECONDS` (also the bound without a TTL). It is fixed when the server
    is built: a reload that raises the TTL does not change it.
    """
    ttl = config.scheduler.queue_ttl_seconds
    unrequested = UNREQUESTED_MIN_SECONDS
    if ttl is not None:
        twice = 2 * ttl
        if not math.isfinite(twice):  # TOML allows `inf`
            unrequested = _INT_ARG_MAX
        else:
            unrequested = min(max(unrequested, math.ceil(twice)), _INT_ARG_MAX)
    return [
        ("grpc.max_receive_message_length", 8 * 1024 * 1024),
        # Both limits: above the soft one gRPC refuses only some requests at random.
        ("grpc.max_metadata_size", config.limits.max_metadata_bytes),
        ("grpc.absolute_max_metadata_size", config.limits.max_metadata_bytes),
        # gRPC core cancels new calls once ~1000 wait to be accepted; a burst of
        # clients is what fairq's own queue (and its caps) exist to absorb.
        ("grpc.server.max_pending_requests", config.scheduler.max_queued_total),
        ("grpc.server.max_pending_requests_hard_limit", config.scheduler.max_queued_total),
        ("grpc.server_max_unrequested_time_in_server", unrequested),
        ("grpc.so_reuseport", 0),
        # HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: without it a client may open streams
        # without bound on one connection.
        ("grpc.max_concurrent_streams", config.limits.max_streams_per_connection),
        # Connections: ping an idle client every minute and drop it if the ping is not
        # answered in 20 s (a peer gone without a FIN); close a connection that has had no
        # call for 5 minutes (the client reconnects transparently when it needs to).
        ("grpc.keepalive_time_ms", KEEPALIVE_SECONDS * 1000),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_SECONDS * 1000),
        ("grpc.max_connection_idle_ms", CONNECTION_IDLE_SECONDS * 1000),
    ]


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS credentials for the gRPC port; a client CA makes client certificates mandatory."""
    with open(tls.key_file, "rb") as f:
        key = f.read()
    with open(tls.cert_file, "rb") as f:
        cert = f.read()
    client_ca = None
    if tls.client_ca_file:
        with open(tls.client_ca_file, "rb") as f:
            client_ca = f.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


class FairqServer:
    """A running fairq: the core, the gRPC server and the metrics endpoint.

    Use as an async context manager, or call :meth:`start` and :meth:`stop`::

        async with FairqServer(config) as server:
            print(server.port)
    """

    def __init__(self, config: Config, telemetry: Telemetry | None = None) -> None:
        self.config = config
        self.core = FairqCore(config, telemetry, on_health=self._scheduling_health)
        self.auth = Authenticator(config.keys, self.core.tier_names)
        self.store: Store | None = None
        if config.store is not None:
            replica = config.cluster.replica_id if config.cluster else _process_name()
            registry = self.core.telemetry.registry
            self.store = Store(config.store, config.state_file, config.prices,
                               self.core.tier_names, replica, registry)  # fmt: skip
        self.request_log = RequestLog(config.access_log, usage=self.store)
        self.port = 0
        self.metrics_port = 0
        self.http_port = 0
        self._http: HttpDoor | None = None
        self._server = grpc.aio.server(options=server_options(config))
        self._guard = RequestGuard(config.limits.request_receive_seconds)
        self._health = HealthServicer()
        self._health_tasks: set[asyncio.Task[None]] = set()
        self._metrics_http: object | None = None
        self._collector = Collector(
            self.core.live_requests,
            lambda generation, seconds: self.core.telemetry.gc_pause.labels(
                str(generation)
            ).observe(seconds),
        )

    def _scheduling_health(self, serving: bool) -> None:
        """Report NOT_SERVING while the dispatcher loop is down (it restarts by itself)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", _SERVICES[0]):
            task = asyncio.get_running_loop().create_task(self._health.set(name, status))
            self._health_tasks.add(task)
            task.add_done_callback(self._health_tasks.discard)

    async def __aenter__(self) -> FairqServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(grace=1.0)

    async def start(self) -> None:
        """Open the store, register configured backends, bind the ports and start serving."""
        if self.store is not None:
            await self.store.start()
            self.auth.add_source(self.store.keys)
        await self.core.start()
        # Unary requests are read and decoded by fairq (api/receive.py): bounded in time,
        # refused with INVALID_ARGUMENT when they do not decode.
        registrar = self._guard.registrar(self._server)
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(
            SchedulerServicer(self.core, self.auth, self.request_log), registrar
        )
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(self.core, self.auth, self.request_log.recent, self.store), registrar
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, registrar)
        enable_reflection((*_SERVICES, health.SERVICE_NAME), self._server)
        if self.config.tls is None:
            self.port = self._server.add_insecure_port(self.config.listen)
        else:
            self.port = self._server.add_secure_port(
                self.config.listen, server_credentials(self.config.tls)
            )
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        await self._server.start()
        for name in ("", *_SERVICES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.config.http.listen:
            self._http = HttpDoor(self.core, self.auth, self.config.http.listen, self.request_log)
            await self._http.start()
            self.http_port = self._http.port
        if self.config.metrics_listen:
            host, _, port = self.config.metrics_listen.rpartition(":")
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
        # Everything that can refuse the file has run; from here on it is applied whole.
        await self.core.reconfigure(config)
        self.auth.install(keys)
        self.request_log.set_enabled(config.access_log)
        if self.store is not None:
            if config.store != self.config.store:
                log.warning("[store] cannot change on reload; restart to apply it (prices do)")
            self.store.reconfigure(config.prices, self.core.tier_names)
        self.config = config
        _warn_open_mode(config, self.auth.open_mode)
        log.info("configuration reloaded")

    async def stop(self, grace: float) -> None:
        """Stop accepting, answer queued requests UNAVAILABLE, let running ones finish.

        Running streams get ``grace`` seconds before they are cancelled.
        """
        for name in ("", *_SERVICES):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.gather(
            self.core.close_queues(), self._server.stop(grace), self._stop_http(grace)
        )
        await self.core.close()
        if self.store is not None:  # every request has ended: its row is in the buffer
            await self.store.close()
        await self._collector.stop()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()  # type: ignore[attr-defined]

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
        """Block until the server stops."""
        await self._server.wait_for_termination()


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
        "(`fairq keys new --user NAME`) before exposing %s beyond this machine.",
        config.listen,
    )
