"""The Admin RPCs over fairq's store: stored keys (create, list, revoke, rotate), usage reports.

Mixed into :class:`~fairq_server.doors.grpc.admin.AdminServicer`; every call requires an admin, as
the rest of the Admin service does. A fairq configured without a store answers
``FAILED_PRECONDITION``.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Awaitable
from typing import TypeVar

import grpc

from fairq.v1 import admin_pb2
from fairq_server.doors.grpc.status import status_for
from fairq_server.errors import SchedulerError
from fairq_server.identity.auth import Authenticator
from fairq_server.store.engine import short_error, unreachable
from fairq_server.store.keys import StoredKey
from fairq_server.store.reports import GROUPINGS
from fairq_server.store.service import Store

__all__ = ["StoreAdmin", "stored_key_message"]

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext
T = TypeVar("T")
_MAX_TIERS = 64


def stored_key_message(key: StoredKey) -> admin_pb2.StoredKey:
    """Return the wire form of ``key``."""
    return admin_pb2.StoredKey(
        id=key.id,
        user=key.user,
        team=key.team or "",
        tiers=list(key.tiers),
        admin=key.admin,
        created_at_unix_seconds=key.created_at,
        expires_at_unix_seconds=key.expires_at or 0.0,
        revoked_at_unix_seconds=key.revoked_at or 0.0,
        replaces=key.replaces or "",
    )


class StoreAdmin:
    """Admin RPCs backed by the store; the servicer sets ``_store``, ``_auth``, ``_authorize``."""

    _store: Store | None
    _auth: Authenticator

    async def _authorize(self, context: Context[object, object]) -> str:
        raise NotImplementedError  # provided by AdminServicer

    async def _audit(self, who: str, action: str, target: str, detail: str = "") -> None:
        """Record a change made through the Admin API (when fairq has a store).

        The change is made by then: an audit write that fails is logged and does not turn
        the call into an error.
        """
        if self._store is None:
            return
        try:
            await self._store.audit.record(who, "admin-api", action, target, detail)
        except Exception as exc:
            log.error(
                "admin: the audit log did not take %s %s by '%s': %s", action, target, who, exc
            )

    async def _store_call(self, context: Context[object, object], call: Awaitable[T]) -> T:
        """Await ``call``, answering a domain error or a database failure with a status.

        A store that has not answered the replica's polls for longer than the connect
        timeout is down or hung: the call is answered at once instead of waiting out the
        driver's statement timeout (30 s on a hung server) for the same answer.
        """
        store = self._store
        if store is not None:
            silent = store.silent_seconds()
            if silent > store.config.connect_timeout_seconds:
                if inspect.iscoroutine(call):
                    call.close()  # not awaited: nothing of it ran
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the store ({store.described}) is unavailable: it has not answered "
                    f"for {silent:.0f} s",
                )
        try:
            return await call
        except SchedulerError as exc:
            await context.abort(*status_for(exc))
        except Exception as exc:
            # The database down or dropping connections is an outage, not a bad request
            # (a refused connect is an OSError, which once answered INVALID_ARGUMENT).
            if not unreachable(exc) and isinstance(exc, ValueError):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:500])
            await context.abort(grpc.StatusCode.UNAVAILABLE, self._unavailable(exc))
        raise AssertionError("unreachable")  # abort raises

    def _unavailable(self, exc: Exception) -> str:
        """Say which store failed, and how, in one line."""
        where = self._store.described if self._store is not None else "?"
        how = "is unavailable" if unreachable(exc) else "did not answer"
        return f"the store ({where}) {how}: {short_error(exc)}"

    async def _need_store(self, context: Context[object, object]) -> tuple[Store, str]:
        """Return the store and the calling admin's identity."""
        who = await self._authorize(context)
        if self._store is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "this fairq runs without a [store]"
            )
        assert self._store is not None
        return self._store, who

    async def CreateKey(
        self, request: admin_pb2.CreateKeyRequest, context: Context[object, object]
    ) -> admin_pb2.CreateKeyResponse:
        """Make a stored key and return it once."""
        store, who = await self._need_store(context)
        expires = request.expires_in_seconds
        if not math.isfinite(expires) or expires < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "expires_in_seconds must be 0 or more"
            )
        if len(request.tiers) > _MAX_TIERS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"at most {_MAX_TIERS} tiers")
        key, secret = await self._store_call(
            context,
            store.keys.create(
                request.user,
                team=request.team or None,
                tiers=tuple(request.tiers),
                admin=request.admin,
                expires_at=time.time() + expires if expires else None,
                open_mode=self._auth.open_mode,
            ),
        )
        detail = f"user {key.user}, team {key.team or '-'}, tiers {','.join(key.tiers) or 'all'}"
        await self._audit(who, "key.create", key.id, detail + (", admin" * key.admin))
        return admin_pb2.CreateKeyResponse(key=stored_key_message(key), secret=secret)

    async def ListKeys(
        self, request: admin_pb2.ListKeysRequest, context: Context[object, object]
    ) -> admin_pb2.ListKeysResponse:
        """List the stored keys."""
        store, _ = await self._need_store(context)
        keys = await self._store_call(
            context, store.keys.list(include_revoked=request.include_revoked)
        )
        return admin_pb2.ListKeysResponse(keys=[stored_key_message(k) for k in keys])

    async def RevokeKey(
        self, request: admin_pb2.RevokeKeyRequest, context: Context[object, object]
    ) -> admin_pb2.RevokeKeyResponse:
        """Revoke a stored key on every replica."""
        store, who = await self._need_store(context)
        key = await self._store_call(context, store.keys.revoke(request.id))
        if key is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no stored key {request.id[:64]!r}")
        assert key is not None
        await self._audit(who, "key.revoke", key.id, f"user {key.user}")
        return admin_pb2.RevokeKeyResponse(key=stored_key_message(key))

    async def RotateKey(
        self, request: admin_pb2.RotateKeyRequest, context: Context[object, object]
    ) -> admin_pb2.RotateKeyResponse:
        """Replace a stored key by a new one like it."""
        store, who = await self._need_store(context)
        if not math.isfinite(request.grace_seconds):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "grace_seconds must be finite")
        rotated = await self._store_call(
            context, store.keys.rotate(request.id, request.grace_seconds)
        )
        if rotated is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no unrevoked stored key {request.id[:64]!r}"
            )
        assert rotated is not None
        detail = f"replaced by {rotated[0].id}, user {rotated[0].user}"
        await self._audit(who, "key.rotate", request.id, detail)
        return admin_pb2.RotateKeyResponse(key=stored_key_message(rotated[0]), secret=rotated[1])

    async def GetUsageReport(
        self, request: admin_pb2.GetUsageReportRequest, context: Context[object, object]
    ) -> admin_pb2.GetUsageReportResponse:
        """Sum the usage ledger by team, user or model."""
        store, _ = await self._need_store(context)
        if request.by not in GROUPINGS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"by must be one of {', '.join(sorted(GROUPINGS))}",
            )
        since, until = request.since_unix_seconds, request.until_unix_seconds
        if not (math.isfinite(since) and math.isfinite(until)) or since < 0 or until < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "since and until must be Unix times >= 0"
            )
        rows = await self._store_call(context, store.report(request.by, since, until or None))
        return admin_pb2.GetUsageReportResponse(
            rows=[
                admin_pb2.UsageSummary(
                    name=r.name or "",
                    requests=r.requests,
                    finished=r.finished,
                    input_tokens=r.input_tokens,
                    output_tokens=r.output_tokens,
                    cost=r.cost,
                    no_team=request.by == "team" and r.name is None,
                )
                for r in rows
            ]
        )
