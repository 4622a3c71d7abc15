"""Stored keys at the edges: the first key of an open-mode fairq, and what the server's log
says of a refused key (revoked, expired or unknown) while the caller learns none of it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from .helpers import store_config
from .test_stored_keys import bearer, generate


async def test_the_first_key_of_open_mode_must_be_an_admin_key(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    server = await fairq_factory(store_config(f"sqlite:///{tmp_path / 'k.db'}", [sim_backend(sim)]))
    assert server.auth.open_mode
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        # Once: a user's key was made, open mode ended, and no admin was left at all.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.CreateKey(admin_pb2.CreateKeyRequest(user="ann"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must be an admin key" in (info.value.details() or "")
        assert server.auth.open_mode  # nothing made
        assert server.store is not None and await server.store.keys.list() == []
        made = await admin.CreateKey(admin_pb2.CreateKeyRequest(user="root", admin=True))
        assert not server.auth.open_mode
        # The admin key administers; a user's key can be made now.
        await admin.CreateKey(admin_pb2.CreateKeyRequest(user="ann"), metadata=bearer(made.secret))
        listed = await admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=bearer(made.secret))
        assert sorted(k.user for k in listed.keys) == ["ann", "root"]


async def test_the_log_tells_a_revoked_or_expired_key_from_an_unknown_one(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    url = f"sqlite:///{tmp_path / 'k.db'}"
    server = await fairq_factory(store_config(url, [sim_backend(sim)], keys=(KEYS["root-key"],)))
    assert server.store is not None
    keys = server.store.keys
    gone, revoked = await keys.create("ann")
    await keys.revoke(gone.id)
    old, expired = await keys.create("bo", expires_at=time.time() + 0.5)
    target = f"127.0.0.1:{server.port}"
    caplog.set_level(logging.INFO, logger="fairq_server.identity.auth")
    for secret, said in [
        (revoked, f"stored key {gone.id} of user 'ann', revoked at "),
        (expired, f"stored key {old.id} of user 'bo', expired at "),
        ("fq_nobody", "not a known key"),
    ]:
        if secret == expired:  # the expiry itself is the subject
            # Real clock: a live server compares the key's expires_at with time.time().
            await asyncio.sleep(max(old.expires_at - time.time(), 0) + 0.05)  # type: ignore[operator]
        caplog.clear()
        # The caller is told nothing of it; each refusal is one line (the throttle reset).
        server.auth._refusals._last = -float("inf")
        assert await generate(target, secret) == grpc.StatusCode.UNAUTHENTICATED
        lines = [r.getMessage() for r in caplog.records if "API key refused" in r.getMessage()]
        assert len(lines) == 1 and said in lines[0], lines
        assert secret not in lines[0]
