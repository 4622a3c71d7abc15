"""The ``fairq.v1.Admin`` servicer: register, drain and list backends."""

from __future__ import annotations

import time

import grpc

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_server.auth import Authenticator
from fairq_server.backends.registry import BackendEntry
from fairq_server.config import BackendConfig
from fairq_server.core import FairqCore
from fairq_server.errors import InvalidRequestError, SchedulerError, status_for

__all__ = ["AdminServicer"]

_KIND_NAMES = {admin_pb2.BACKEND_KIND_VLLM: "vllm", admin_pb2.BACKEND_KIND_TGI: "tgi"}
_KIND_VALUES = {v: k for k, v in _KIND_NAMES.items()}

Context = grpc.aio.ServicerContext


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """Backend management; every call requires an admin principal."""

    def __init__(self, core: FairqCore, auth: Authenticator) -> None:
        self._core = core
        self._auth = auth

    async def _authorize(self, context: Context[object, object]) -> None:
        try:
            principal = self._auth.authenticate(context.invocation_metadata() or ())
            self._auth.require_admin(principal)
        except SchedulerError as exc:
            await context.abort(*status_for(exc))

    async def RegisterBackend(
        self,
        request: admin_pb2.RegisterBackendRequest,
        context: Context[admin_pb2.RegisterBackendRequest, admin_pb2.RegisterBackendResponse],
    ) -> admin_pb2.RegisterBackendResponse:
        """Validate and register a backend; its first scrape is done before returning."""
        await self._authorize(context)  # type: ignore[arg-type]
        b = request.backend
        try:
            if b.kind not in _KIND_NAMES:
                raise InvalidRequestError("backend.kind must be BACKEND_KIND_VLLM or _TGI")
            cfg = BackendConfig(
                id=b.id,
                kind=_KIND_NAMES[b.kind],
                base_url=b.base_url,
                models=tuple(b.models),
                priority_scheduling=b.priority_scheduling,
                max_in_flight=b.max_in_flight,
            )
            entry = await self._core.register_backend(cfg, from_rpc=True)
        except SchedulerError as exc:
            await context.abort(*status_for(exc))
        return admin_pb2.RegisterBackendResponse(status=self._status(entry))

    async def DeregisterBackend(
        self,
        request: admin_pb2.DeregisterBackendRequest,
        context: Context[admin_pb2.DeregisterBackendRequest, admin_pb2.DeregisterBackendResponse],
    ) -> admin_pb2.DeregisterBackendResponse:
        """Remove a backend, optionally waiting for its in-flight requests."""
        await self._authorize(context)  # type: ignore[arg-type]
        if not await self._core.deregister_backend(request.id, drain=request.drain):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no backend '{request.id[:128]}'")
        return admin_pb2.DeregisterBackendResponse()

    async def ListBackends(
        self,
        request: admin_pb2.ListBackendsRequest,
        context: Context[admin_pb2.ListBackendsRequest, admin_pb2.ListBackendsResponse],
    ) -> admin_pb2.ListBackendsResponse:
        """List every backend with its live state."""
        await self._authorize(context)  # type: ignore[arg-type]
        return admin_pb2.ListBackendsResponse(
            backends=[self._status(e) for e in self._core.pool.entries()]
        )

    def _status(self, entry: BackendEntry) -> admin_pb2.BackendStatus:
        return _status(entry, self._core.config.scheduler.stale_after_seconds, time.monotonic())


def _status(entry: BackendEntry, stale_after: float, now: float) -> admin_pb2.BackendStatus:
    """Return the backend's live state.

    ``healthy`` is what admin.proto promises: the last scrape succeeded and its snapshot is
    fresh by the gate's own measure (at most ``stale_after`` seconds old at ``now``), so a
    backend the gate refuses as stale is not listed as healthy.
    """
    b, load = entry.backend, entry.load
    snap = load.snapshot
    fresh = snap is not None and now - snap.taken_at <= stale_after
    return admin_pb2.BackendStatus(
        backend=admin_pb2.Backend(
            id=b.id,
            kind=_KIND_VALUES.get(b.kind, admin_pb2.BACKEND_KIND_UNSPECIFIED),
            base_url=b.base_url,
            models=list(b.models),
            priority_scheduling=b.priority_scheduling,
            max_in_flight=b.max_in_flight,
        ),
        healthy=entry.poller.healthy is True and fresh,
        in_flight=load.in_flight,
        waiting=snap.waiting if snap else 0.0,
        running=snap.running if snap else 0.0,
        tpot_seconds=(snap.tpot_seconds or 0.0) if snap else 0.0,
        draining=load.draining,
    )
