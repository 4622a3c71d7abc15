"""One registry: RegisterBackend means the same with one process (state file) and a cluster.

Open mode (no keys) lets any caller use the Admin API on loopback, as in the other tests.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import grpc

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.schema import Config
from fairq_sim import SimServer
from tests.conftest import FairqFactory, make_config
from tests.reliability.helpers import until


async def register(server: FairqServer, sim: SimServer, backend_id: str = "sim-rpc") -> None:
    backend = admin_pb2.Backend(
        id=backend_id, kind=admin_pb2.BACKEND_KIND_VLLM, base_url=sim.url, models=["sim"]
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        await admin_pb2_grpc.AdminStub(ch).RegisterBackend(
            admin_pb2.RegisterBackendRequest(backend=backend)
        )


async def deregister(server: FairqServer, backend_id: str = "sim-rpc") -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        await admin_pb2_grpc.AdminStub(ch).DeregisterBackend(
            admin_pb2.DeregisterBackendRequest(id=backend_id)
        )


def ids(server: FairqServer) -> set[str]:
    return {b.id for b in server.core.backends()}


async def test_state_file_keeps_rpc_registrations_across_a_restart(
    sim: SimServer, tmp_path: Path
) -> None:
    state = tmp_path / "state" / "fairq-state.json"
    config = replace(make_config(), state_file=str(state))
    server = FairqServer(config)
    await server.start()
    try:
        await register(server, sim)
        assert json.loads(state.read_text())["backends"][0]["base_url"] == sim.url
    finally:
        await server.stop(grace=0.5)
    server = FairqServer(config)  # a new process would read the same file
    await server.start()
    try:
        assert ids(server) == {"sim-rpc"}
        await deregister(server)
        assert json.loads(state.read_text())["backends"] == []
    finally:
        await server.stop(grace=0.5)
    server = FairqServer(config)
    await server.start()
    try:
        assert ids(server) == set()
    finally:
        await server.stop(grace=0.5)


def cluster_config(redis_url: str, replica: str) -> Config:
    return replace(make_config(), cluster=ClusterConfig(redis_url, replica_id=replica))


async def test_a_registration_on_one_replica_is_seen_by_all_and_survives_restarts(
    sim: SimServer, redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    a = await fairq_factory(cluster_config(redis_server.url, "a"))
    b = await fairq_factory(cluster_config(redis_server.url, "b"))
    await register(a, sim)
    await until(lambda: ids(b) == {"sim-rpc"}, what="replica b sees the registration")
    await a.stop(grace=0.5)
    await b.stop(grace=0.5)
    c = await fairq_factory(cluster_config(redis_server.url, "c"))  # every replica restarted
    await until(lambda: ids(c) == {"sim-rpc"}, what="a new replica finds it")
    d = await fairq_factory(cluster_config(redis_server.url, "d"))
    await until(lambda: ids(d) == {"sim-rpc"}, what="and another")
    await deregister(d)
    await until(lambda: ids(c) == set(), what="a deregistration reaches every replica")
