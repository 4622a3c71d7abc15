"""The database stopped under a running fairq: the Admin RPCs over the store answer
UNAVAILABLE naming the store, promptly, and the ledger says when its writes resume."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_bench.postgres_process import PostgresProcess
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from .helpers import counter, store_config, until
from .test_stored_keys import generate

ROOT = (("authorization", "Bearer root-key"),)


async def test_a_stopped_database_is_unavailable_not_a_bad_request(
    sim: SimServer,
    fairq_factory: FairqFactory,
    postgres: PostgresProcess,
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = store_config(
        postgres_url, [sim_backend(sim)], keys=(KEYS["root-key"],),
        store={"connect_timeout_seconds": 2.0},
    )  # fmt: skip
    server = await fairq_factory(config)
    assert server.store is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        await admin.CreateKey(admin_pb2.CreateKeyRequest(user="ann"), metadata=ROOT)
        postgres.stop()
        try:
            calls = {
                "ListKeys": lambda: admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=ROOT),
                "CreateKey": lambda: admin.CreateKey(
                    admin_pb2.CreateKeyRequest(user="bo"), metadata=ROOT
                ),
                "GetUsageReport": lambda: admin.GetUsageReport(
                    admin_pb2.GetUsageReportRequest(by="user"), metadata=ROOT
                ),
            }
            for name, call in calls.items():
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call()
                took = time.monotonic() - started
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE, (name, info.value)
                details = info.value.details() or ""
                assert details.startswith("the store (postgresql"), (name, details)
                assert "127.0.0.1" in details and "is unavailable: " in details, (name, details)
                assert "Errno 111" in details, (name, details)  # the cause, one line
                # Refused at once: not the connect timeout, let alone beyond it.
                assert took < 2.0, (name, took)
            # A request served meanwhile: its usage row waits in the ledger's buffer.
            assert await generate(f"127.0.0.1:{server.port}", "root-key") == grpc.StatusCode.OK
            await until(lambda: counter(server, "fairq_ledger_write_errors_total") > 0)
        finally:
            caplog.set_level(logging.INFO, logger="fairq_server.store.ledger")
            postgres.start()
        # The ledger's next write goes through, and it says so once.
        await until(lambda: server.store is not None and server.store.ledger.pending == 0)
        resumed = [r for r in caplog.records if "writes go through again" in r.getMessage()]
        assert len(resumed) == 1 and resumed[0].levelno == logging.INFO, resumed
        listed = await admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=ROOT)
        assert [k.user for k in listed.keys] == ["ann"]


def _stop_postgres(postgres: PostgresProcess, stopped: list[int]) -> None:
    """SIGSTOP every process of ``postgres``, the postmaster first (it forks no more then)."""
    postmaster = int((postgres.data / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGSTOP)
    stopped.append(postmaster)
    for pid in map(int, Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()):
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)


async def test_a_hung_database_is_answered_at_once_after_the_connect_timeout(
    sim: SimServer, fairq_factory: FairqFactory, postgres: PostgresProcess, postgres_url: str
) -> None:
    config = store_config(
        postgres_url, [sim_backend(sim)], keys=(KEYS["root-key"],),
        store={"connect_timeout_seconds": 1.0},
    )  # fmt: skip
    server = await fairq_factory(config)
    assert server.store is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        # A connection left in the pool: the next call checks it with a ping, which a hung
        # server never answers (the driver's statement timeout, 30 s, ends it).
        await admin_pb2_grpc.AdminStub(channel).ListKeys(admin_pb2.ListKeysRequest(), metadata=ROOT)
    # A hung server (a host that stalls, not one that refuses): every PostgreSQL process of
    # this test stopped, the postmaster first so that it starts no new one meanwhile.
    stopped: list[int] = []
    try:
        _stop_postgres(postgres, stopped)
        # Once: each call waited out the driver's statement timeout (measured 32 s).
        await until(lambda: server.store.silent_seconds() > 1.0)  # type: ignore[union-attr]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=ROOT, timeout=20)
            took = time.monotonic() - started
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        assert "is unavailable: it has not answered for " in (info.value.details() or "")
        assert took < 5.0, took
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    # Answering again, it is asked again.
    await until(lambda: server.store.silent_seconds() < 1.0, timeout=60)  # type: ignore[union-attr]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        await admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=ROOT)
