"""The gRPC door: Scheduler, Admin, health and reflection on one port."""

from __future__ import annotations

import asyncio
import logging
import math

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import Config, TlsConfig
from fairq_server.doors.access_log import RequestLog
from fairq_server.doors.grpc.admin import AdminServicer
from fairq_server.doors.grpc.discovery import HealthServicer, enable_reflection
from fairq_server.doors.grpc.receive import RequestGuard
from fairq_server.doors.grpc.scheduler import SchedulerServicer
from fairq_server.doors.listening import add_grpc_port
from fairq_server.identity.auth import Authenticator
from fairq_server.port import CorePort
from fairq_server.store.service import Store
from fairq_server.tenancy.managed import ManagedEntitlement

__all__ = ["GrpcDoor", "server_credentials", "server_options"]

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
        # Connections per port: without it each silent connection holds a descriptor until
        # the idle bound below, and enough of them exhaust the process's descriptors.
        ("grpc.max_allowed_incoming_connections", config.limits.max_grpc_connections),
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


class GrpcDoor:
    """Serves the Scheduler and Admin services of ``core``, with health and reflection.

    Args:
        config: the configuration (listen address, TLS, limits; fixed for the door's life).
        core: the scheduling core (shared with the HTTP door).
        auth: the authenticator (shared with the HTTP door).
        request_log: where finished calls are reported.

    Attributes:
        port: the bound port once started.

    """

    def __init__(
        self,
        config: Config,
        core: CorePort,
        auth: Authenticator,
        request_log: RequestLog,
        store: Store | None = None,
    ) -> None:
        self._config = config
        self._core = core
        self._auth = auth
        self._request_log = request_log
        self._store = store
        # Team weights, quotas and budgets set live; given by the server once its store is open.
        self.managed: ManagedEntitlement | None = None
        self.port = 0
        self._server = grpc.aio.server(options=server_options(config))
        self._guard = RequestGuard(config.limits.request_receive_seconds)
        self._health = HealthServicer()
        self._health_tasks: set[asyncio.Task[None]] = set()

    def scheduling_health(self, serving: bool) -> None:
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

    async def start(self) -> None:
        """Register the services, bind the port and start serving.

        Raises:
            OSError: the address cannot be bound.

        """
        # Unary requests are read and decoded by fairq (api/receive.py): bounded in time,
        # refused with INVALID_ARGUMENT when they do not decode.
        registrar = self._guard.registrar(self._server)
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(
            SchedulerServicer(self._core, self._auth, self._request_log), registrar
        )
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(
                self._core, self._auth, self._request_log.recent, self._store, self.managed
            ),
            registrar,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, registrar)
        enable_reflection((*_SERVICES, health.SERVICE_NAME), self._server)
        config = self._config
        credentials = None if config.tls is None else server_credentials(config.tls)
        self.port = add_grpc_port(self._server, "listen", config.listen, credentials)
        await self._server.start()
        for name in ("", *_SERVICES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def not_serving(self) -> None:
        """Report NOT_SERVING for every service (the process is stopping)."""
        for name in ("", *_SERVICES):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace: float) -> None:
        """Stop accepting calls; running ones get ``grace`` seconds before they are cancelled."""
        await self._server.stop(grace)

    async def wait_for_termination(self) -> None:
        """Block until the server stops."""
        await self._server.wait_for_termination()
