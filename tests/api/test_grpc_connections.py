"""The gRPC port bounds its connections: silent connections beyond ``max_grpc_connections``
do not hold descriptors, and callers get UNAVAILABLE rather than a hang."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairq_server.config.schema import RequestBounds

from ..conftest import FairqFactory, make_config


async def check(port: int) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_connections_beyond_the_cap_are_refused(fairq_factory: FairqFactory) -> None:
    config = replace(make_config(), limits=RequestBounds(max_grpc_connections=2))
    server = await fairq_factory(config)
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        assert await check(server.port) != grpc.StatusCode.OK
    finally:
        silent.pop().close()
    # gRPC notices the closed connection asynchronously: retry within a deadline.
    async with asyncio.timeout(10):
        while await check(server.port) != grpc.StatusCode.OK:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    for sock in silent:
        sock.close()
