"""The ``fairq.v1.Admin`` servicer: register, drain and list backends; queue snapshots."""

from __future__ import annotations

import time

import grpc

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_server.config.schema import BackendConfig
from fairq_server.doors.grpc.admin_entitlement import EntitlementAdmin
from fairq_server.doors.grpc.snapshot import KIND_VALUES, backend_status, build_snapshot
from fairq_server.doors.grpc.status import status_for
from fairq_server.errors import InvalidRequestError, SchedulerError
from fairq_server.identity.auth import Authenticator
from fairq_server.observe.recent import RecentService
from fairq_server.port import CorePort
from fairq_server.store.service import Store
from fairq_server.tenancy.managed import ManagedEntitlement

__all__ = ["AdminServicer"]

# The proto's enum names follow the kind names: BACKEND_KIND_<NAME>.
_KIND_NAMES = {admin_pb2.BackendKind.Value(v): k for k, v in KIND_VALUES.items()}

Context = grpc.aio.ServicerContext


class AdminServicer(EntitlementAdmin, admin_pb2_grpc.AdminServicer):
    """Backends, stored keys, usage, teams, limits, the audit log; admins only."""

    def __init__(
        self,
        core: CorePort,
        auth: Authenticator,
        recent: RecentService | None = None,
        store: Store | None = None,
        managed: ManagedEntitlement | None = None,
    ) -> None:
        self._core = core
        self._auth = auth
        self._recent = recent if recent is not None else RecentService()
        self._store = store
        self._managed = managed

    async def _authorize(self, context: Context[object, object]) -> str:
        """Return the calling admin's identity (the call is aborted for anyone else)."""
        try:
            principal = await self._auth.authenticate(context.invocation_metadata() or ())
            self._auth.require_admin(principal)
        except SchedulerError as exc:
            await context.abort(*status_for(exc))
        return principal.user

    async def RegisterBackend(
        self,
        request: admin_pb2.RegisterBackendRequest,
        context: Context[admin_pb2.RegisterBackendRequest, admin_pb2.RegisterBackendResponse],
    ) -> admin_pb2.RegisterBackendResponse:
        """Register a backend (checked like one in the file); its first scrape comes first."""
        who = await self._authorize(context)  # type: ignore[arg-type]
        b = request.backend
        try:
            if b.kind not in _KIND_NAMES:
                valid = " or ".join(admin_pb2.BackendKind.Name(k) for k in _KIND_NAMES)
                raise InvalidRequestError(f"backend.kind must be {valid}")
            cfg = BackendConfig(
                id=b.id,
                kind=_KIND_NAMES[b.kind],
                base_url=b.base_url,
                models=tuple(b.models),
                priority_scheduling=b.priority_scheduling,
                fair_share_priority=b.fair_share_priority,
                max_in_flight=b.max_in_flight,
                metrics_preset=b.metrics_preset,
                waiting_metric=b.waiting_metric,
                running_metric=b.running_metric,
                kv_usage_metric=b.kv_usage_metric,
                tpot_metric=b.tpot_metric,
                priority_order=b.priority_order,
                api_key_env=b.api_key_env,
                preempt=b.preempt,
            )
            # The rules of a backend definition (config/backends.py) are checked as it is built.
            state = await self._core.register_remote(cfg)
        except SchedulerError as exc:
            await context.abort(*status_for(exc))
        detail = f"{cfg.kind} {cfg.base_url} models {','.join(cfg.models)}"
        await self._audit(who, "backend.register", cfg.id, detail)
        return admin_pb2.RegisterBackendResponse(status=backend_status(state))

    async def DeregisterBackend(
        self,
        request: admin_pb2.DeregisterBackendRequest,
        context: Context[admin_pb2.DeregisterBackendRequest, admin_pb2.DeregisterBackendResponse],
    ) -> admin_pb2.DeregisterBackendResponse:
        """Remove a backend, optionally waiting for its in-flight requests."""
        who = await self._authorize(context)  # type: ignore[arg-type]
        if not await self._core.deregister_backend(request.id, drain=request.drain):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no backend '{request.id[:128]}'")
        await self._audit(who, "backend.deregister", request.id, "drained" if request.drain else "")
        return admin_pb2.DeregisterBackendResponse()

    async def ListBackends(
        self,
        request: admin_pb2.ListBackendsRequest,
        context: Context[admin_pb2.ListBackendsRequest, admin_pb2.ListBackendsResponse],
    ) -> admin_pb2.ListBackendsResponse:
        """List every backend with its live state."""
        await self._authorize(context)  # type: ignore[arg-type]
        return admin_pb2.ListBackendsResponse(
            backends=[backend_status(b) for b in self._core.backend_views()]
        )

    async def GetQueueSnapshot(
        self,
        request: admin_pb2.GetQueueSnapshotRequest,
        context: Context[admin_pb2.GetQueueSnapshotRequest, admin_pb2.GetQueueSnapshotResponse],
    ) -> admin_pb2.GetQueueSnapshotResponse:
        """Report queue depth, top users and backend gate state at this moment."""
        await self._authorize(context)  # type: ignore[arg-type]
        view = self._core.queue_view()
        return build_snapshot(view, self._recent, request.top_users, time.time())
