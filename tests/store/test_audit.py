"""The audit log: the Admin API's changes recorded with who made them, newest first, bounded
by age and by rows, on both engines."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime
from html import escape

import aiohttp
import grpc
import pytest
from sqlalchemy import select

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_bench.postgres_process import PostgresProcess
from fairq_server.config.loader import parse_config
from fairq_server.config.schema import ConfigError, ConsoleConfig
from fairq_server.config.store import StoreConfig
from fairq_server.store.audit import AuditLog
from fairq_server.store.engine import open_engine, upgrade
from fairq_server.store.schema import audit_log
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from .helpers import store_config

ROOT = (("authorization", "Bearer root-key"),)


async def test_recorded_newest_first_filtered_and_pruned_by_age_and_rows(store_url: str) -> None:
    engine = await open_engine(StoreConfig(url=store_url))
    try:
        await upgrade(engine)
        old = datetime.fromtimestamp(time.time() - 2 * 86400, UTC)
        async with engine.begin() as conn:
            await conn.execute(
                audit_log.insert().values(
                    id="old", at=old, actor="ann", via="console", action="key.create",
                    target="k0", detail="", replica="r",
                )
            )  # fmt: skip
        book = AuditLog(engine, "replica-1", retention_seconds=86400, max_rows=3)
        await book.record("root", "admin-api", "key.create", "k1", "user x")
        async with engine.connect() as conn:  # the two-day-old row went with the first write
            ids = (await conn.execute(select(audit_log.c.target))).scalars().all()
        assert ids == ["k1"]
        for target in ("k2", "k3", "k4"):
            await book.record("root", "console", "key.revoke", target, "user x")
        newest = await book.recent()
        assert [e.target for e in newest] == ["k4", "k3", "k2"]  # k1 beyond max_rows (3)
        assert newest[0].actor == "root" and newest[0].via == "console"
        assert newest[0].replica == "replica-1" and abs(newest[0].at - time.time()) < 60
        assert [e.target for e in await book.recent(action="key.create")] == []
        assert [e.target for e in await book.recent(limit=1)] == ["k4"]
        long = await book.record("r" * 900, "console", "backend.register", "b" * 900, "d" * 900)
        assert len(long.actor) == len(long.target) == len(long.detail) == 500
        with pytest.raises(ValueError, match="unknown audit action"):
            await book.record("root", "console", "drop.tables", "x")
    finally:
        await engine.dispose()


def test_audit_bounds_are_checked() -> None:
    # The bounds are the schema's: checked where a file is read.
    with pytest.raises(ConfigError, match=r"store\.audit_max_rows must be an integer >= 1"):
        parse_config({"store": {"audit_max_rows": 0}})
    with pytest.raises(ConfigError, match=r"store\.audit_retention_days must be a finite"):
        parse_config({"store": {"audit_retention_days": float("inf")}})


async def test_admin_api_changes_are_recorded_with_the_admin(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: object
) -> None:
    url = f"sqlite:///{tmp_path}/fairq.db"
    keys = (KEYS["root-key"], KEYS["alice-key"])
    server = await fairq_factory(store_config(url, [sim_backend(sim)], keys=keys))
    assert server.store is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        made = await admin.CreateKey(
            admin_pb2.CreateKeyRequest(user="carol", team="red", tiers=["batch"]), metadata=ROOT
        )
        rotated = await admin.RotateKey(admin_pb2.RotateKeyRequest(id=made.key.id), metadata=ROOT)
        await admin.RevokeKey(admin_pb2.RevokeKeyRequest(id=rotated.key.id), metadata=ROOT)
        # Refused calls change nothing and record nothing.
        with pytest.raises(grpc.aio.AioRpcError):
            await admin.RevokeKey(admin_pb2.RevokeKeyRequest(id="nope"), metadata=ROOT)
        with pytest.raises(grpc.aio.AioRpcError):
            await admin.CreateKey(
                admin_pb2.CreateKeyRequest(user="x"),
                metadata=(("authorization", "Bearer alice-key"),),
            )
        backend = admin_pb2.Backend(
            id="b2", kind=admin_pb2.BACKEND_KIND_VLLM, base_url=sim.url, models=["sim"]
        )
        await admin.RegisterBackend(
            admin_pb2.RegisterBackendRequest(backend=backend), metadata=ROOT
        )
        await admin.DeregisterBackend(
            admin_pb2.DeregisterBackendRequest(id="b2", drain=True), metadata=ROOT
        )
    entries = await server.store.audit.recent()
    assert [(e.actor, e.via, e.action, e.target) for e in reversed(entries)] == [
        ("root", "admin-api", "key.create", made.key.id),
        ("root", "admin-api", "key.rotate", made.key.id),
        ("root", "admin-api", "key.revoke", rotated.key.id),
        ("root", "admin-api", "backend.register", "b2"),
        ("root", "admin-api", "backend.deregister", "b2"),
    ]
    details = [e.detail for e in reversed(entries)]
    assert details[0] == "user carol, team red, tiers batch"
    assert details[1] == f"replaced by {rotated.key.id}, user carol"
    assert details[3] == f"vllm {sim.url.rstrip('/')} models sim" and details[4] == "drained"


async def test_console_audit_and_plot_pages_refuse_bad_input_and_non_admins(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: object
) -> None:
    url_db = f"sqlite:///{tmp_path}/fairq.db"
    config = store_config(url_db, [sim_backend(sim)], keys=tuple(KEYS.values()))
    server = await fairq_factory(replace(config, console=ConsoleConfig(enabled=True)))
    base = f"http://127.0.0.1:{server.http_port}"
    root = {"Authorization": "Bearer root-key"}
    async with aiohttp.ClientSession() as http:
        for path, said in (
            ("/console/audit?action=drop%3Cb%3E", "No action drop&lt;b&gt;."),
            ("/console/usage?step=week", "step must be one of"),
            ("/console/usage?measure=bogus", "measure must be one of"),
            ("/console/usage?since=9999d&step=hour", "at most 800 are plotted"),
            ("/console/usage?since=24h&by=user", "No usage in this range"),
            ("/console/audit", "No change recorded."),
        ):
            async with http.get(base + path, headers=root) as resp:
                assert resp.status == 200, path
                assert said in await resp.text(), path
        async with http.get(
            f"{base}/console/audit", headers={"Authorization": "Bearer alice-key"}
        ) as resp:
            assert resp.status == 403
        async with http.get(f"{base}/console/audit", allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/console/login"


async def test_console_store_views_say_the_database_is_down_instead_of_failing(
    sim: SimServer,
    fairq_factory: FairqFactory,
    postgres: PostgresProcess,
    postgres_url: str,
) -> None:
    config = store_config(postgres_url, [sim_backend(sim)], keys=tuple(KEYS.values()))
    settings = replace(config.store, connect_timeout_seconds=1.0, stop_flush_seconds=1.0)
    config = replace(config, store=settings, console=ConsoleConfig(enabled=True))
    server = await fairq_factory(config)
    base = f"http://127.0.0.1:{server.http_port}"
    root = {"Authorization": "Bearer root-key"}
    postgres.stop()
    try:
        async with aiohttp.ClientSession() as http:
            # An outage is 503 naming the database and the cause (it was 200 and "did not
            # answer" with the raw error), as the Admin API's UNAVAILABLE.
            named = f"store ({server.store.described}) is unavailable: "  # type: ignore[union-attr]
            for path in ("/console/audit", "/console/usage?since=24h", "/console/keys"):
                async with http.get(base + path, headers=root) as resp:
                    assert resp.status == 503, path
                    text = await resp.text()
                    assert "The " + escape(named) in text and "Errno 111" in text, path
            for path in ("/console/usage-series.csv?since=24h", "/console/usage.csv"):
                async with http.get(base + path, headers=root) as resp:
                    assert resp.status == 503, path
                    error = (await resp.json())["error"]
                    assert error.startswith("the " + named) and "Errno 111" in error, error
    finally:
        await asyncio.to_thread(postgres.start)
