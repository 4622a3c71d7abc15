"""Options of fairq's gRPC server: calls gRPC has not handed to fairq yet are not cancelled
before fairq's own queue would give up on them."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairq_server.app import FairqServer
from fairq_server.config.schema import Config
from fairq_server.doors.grpc import server as server_module
from fairq_server.doors.grpc.server import UNREQUESTED_MIN_SECONDS, server_options

from ..conftest import FairqFactory, make_config

UNREQUESTED = "grpc.server_max_unrequested_time_in_server"


def unrequested(config: Config) -> int:
    values = [v for k, v in server_options(config) if k == UNREQUESTED]
    assert len(values) == 1
    return values[0]


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [
        (600.0, UNREQUESTED_MIN_SECONDS),  # the default TTL: the one-hour floor applies
        (None, UNREQUESTED_MIN_SECONDS),
        (7200.5, 14401),  # twice the TTL, rounded up
        (1e12, 2**31 - 1),  # a C int
        (float("inf"), 2**31 - 1),
    ],
)
def test_unrequested_time_is_well_above_the_queue_ttl(ttl: float | None, expected: int) -> None:
    config = make_config(queue_ttl_seconds=ttl)
    value = unrequested(config)
    assert value == expected
    assert isinstance(value, int) and value > 30  # gRPC's default
    if ttl is not None and ttl < 1e9:
        assert value >= 2 * ttl


async def _stall_while_calls_arrive(server: FairqServer, stall: float, calls: int) -> list[str]:
    """Block ``server``'s event loop (it is this one), then send ``calls`` Health checks and
    keep it blocked for ``stall`` seconds after all of them were sent; return each outcome."""
    target = f"127.0.0.1:{server.port}"
    connected = threading.Barrier(calls + 1)
    go = threading.Event()
    sent = threading.Semaphore(0)
    outcomes: list[str] = []

    def client() -> None:
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            connected.wait(timeout=10)
            go.wait(timeout=10)
            future = health_pb2_grpc.HealthStub(channel).Check.future(
                health_pb2.HealthCheckRequest(), timeout=30
            )
            sent.release()
            try:
                future.result()
                outcomes.append("OK")
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)

    threads = [threading.Thread(target=client) for _ in range(calls)]
    for t in threads:
        t.start()
    await asyncio.to_thread(connected.wait, 10)  # every channel connected
    # The stall itself: the loop is blocked, as under a burst of work or a slow callback.
    # It starts before the calls go out (a loaded machine once resumed this loop late enough
    # for gRPC to hand every call to fairq before the stall began).
    go.set()
    for _ in range(calls):
        assert sent.acquire(timeout=10)  # the loop stays blocked: part of the stall
    time.sleep(stall)  # noqa: ASYNC251 - blocking the loop on purpose: this is the fault
    await asyncio.to_thread(lambda: [t.join(timeout=30) for t in threads])
    return outcomes


async def test_calls_arriving_during_an_event_loop_stall_are_served(
    fairq_factory: FairqFactory,
) -> None:
    """FairqServer's own options: calls that wait out a stall in gRPC's pending queue are
    served. (A stall longer than gRPC's 30 s default is too slow for a test; the control
    below shows the stall does hold calls unaccepted and that the option is in force.)"""
    server = await fairq_factory(make_config())
    outcomes = await _stall_while_calls_arrive(server, stall=2.0, calls=4)
    assert outcomes == ["OK"] * 4


async def test_the_option_governs_the_stall_a_short_bound_cancels_calls(
    fairq_factory: FairqFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test above: a stall with the bound FairqServer passes to gRPC
    lowered to 1 s (the default is 30 s) cancels the calls that waited, so the stall does
    leave calls unaccepted and the option FairqServer builds is the one in force."""
    real = server_options

    def short(config: Config) -> list[tuple[str, int]]:
        return [(k, 1 if k == UNREQUESTED else v) for k, v in real(config)]

    monkeypatch.setattr(server_module, "server_options", short)
    server = await fairq_factory(make_config())
    # Three times the bound: a call that reaches gRPC late in the stall still waits past it.
    outcomes = await _stall_while_calls_arrive(server, stall=3.0, calls=4)
    assert "CANCELLED" in outcomes, outcomes
