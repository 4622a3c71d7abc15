"""Faults on real sockets and processes: deadlines, cancels, dead, failing and lying backends.

Each test states which promise of the design it checks. Backends are simulators (in this
process, or a child process where the test must kill one) or a scripted raw HTTP server.
Tests that show a known server defect are strict ``xfail``: they start passing, and then fail
as "unexpectedly passing", when the defect is fixed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq.v1.scheduler_pb2 import GenerateResponse
from fairq_bench.load import ChildProcess, process_group_alive, start_fairq, start_sim
from fairq_server.app import FairqServer
from fairq_server.config.schema import BackendConfig
from fairq_server.scheduling.interfaces import GateOutcome
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .helpers import (
    GenerateCall,
    Outcome,
    ScriptedBackend,
    completion_events,
    fairq_metric,
    gen_request,
    generate,
    raw_reply,
    run_call,
    sim_requests_seen,
    sse_reply,
    until,
    until_async,
)

OK = grpc.StatusCode.OK


def user(name: str) -> tuple[tuple[str, str], ...]:
    return (("x-fairq-user", name),)


@pytest.fixture
async def slow_sim() -> AsyncIterator[SimServer]:
    """A simulator slow enough (~25 ms per token) that a 200-token stream runs for seconds."""
    async with SimServer(SimConfig(model="sim", speed=0.05, max_num_seqs=8)) as s:
        yield s


async def first_chunk(call: GenerateCall, out: Outcome) -> None:
    """Read ``call`` up to and including its first chunk, recording into ``out``."""
    while True:
        response = await call.read()
        assert isinstance(response, GenerateResponse), out
        kind = response.WhichOneof("event")
        assert kind is not None
        out.kinds.append(kind)
        if kind == "started":
            out.backends.append(response.started.backend_id)
        if kind == "chunk":
            return


# Metrics this late are stale (stale_after 0.3 s) but far within the scrape timeout, which
# the tests raise from 1 s: 0.45 s against 1 s failed a scrape when fairq, the simulator and
# the test shared a loop on a loaded machine (stalls past 0.55 s in a long pytest process).
LATE_METRICS = 0.45
LATE_SCRAPE_TIMEOUT = 10.0


def snapshot_age(server: FairqServer, backend_id: str) -> float:
    """Seconds since the scrape behind ``backend_id``'s current gate snapshot was sent."""
    entry = server.core.backend(backend_id)
    assert entry is not None and entry.sample is not None
    return time.monotonic() - entry.sampled_at


async def read_queued(call: GenerateCall) -> None:
    response = await call.read()
    assert isinstance(response, GenerateResponse), response
    assert response.WhichOneof("event") == "queued"


# -- deadlines and cancellation -----------------------------------------------------------


async def test_deadline_expiring_in_queue_removes_request_and_never_dispatches_it(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A client deadline that expires while queued: DEADLINE_EXCEEDED, gone from the queue,
    and the backend never sees the request (not even once the slot frees up)."""
    server = await fairq_factory(make_config([sim_backend(slow_sim, max_in_flight=1)]))
    dispatcher = server.core.dispatcher.model_state("sim")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        blocker = generate(ch, gen_request(max_tokens=400), metadata=user("u"))
        await first_chunk(blocker, Outcome())
        # Same user as the request after it: FIFO within a user, so had the expired request
        # stayed queued it would run before `after`.
        expired = await run_call(
            generate(ch, gen_request(prompt="expired"), metadata=user("u"), timeout=0.5)
        )
        assert expired.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert expired.kinds == ["queued"]
        await until(lambda: len(dispatcher.queue) == 0, what="expired request left the queue")
        assert fairq_metric(server, "fairq_queue_depth", model="sim", tier="interactive") == 0
        blocker.cancel()
        after = await run_call(generate(ch, gen_request(), metadata=user("u")))
    assert after.code is OK and after.finished is not None
    # Two dispatches (blocker, after), and the backend accepted exactly those two.
    assert fairq_metric(server, "fairq_dispatches_total", backend="sim-a", tier="interactive") == 2
    assert await sim_requests_seen(slow_sim) == 2


async def test_cancel_while_queued_frees_the_users_queue_slot(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Cancelling a queued request removes it: the user's queue cap counts it no more."""
    config = make_config([sim_backend(slow_sim, max_in_flight=1)], max_queued_per_user=1)
    server = await fairq_factory(config)
    dispatcher = server.core.dispatcher.model_state("sim")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        blocker = generate(ch, gen_request(max_tokens=400), metadata=user("other"))
        await first_chunk(blocker, Outcome())
        queued = generate(ch, gen_request(), metadata=user("u"))
        await read_queued(queued)
        over_cap = await run_call(generate(ch, gen_request(), metadata=user("u")))
        assert over_cap.code == grpc.StatusCode.RESOURCE_EXHAUSTED, over_cap
        queued.cancel()
        await until(lambda: len(dispatcher.queue) == 0, what="cancelled request left the queue")
        again = generate(ch, gen_request(), metadata=user("u"))
        await read_queued(again)  # accepted: the slot was released
        blocker.cancel()
        done = await run_call(again)
    assert done.code is OK and done.finished is not None
    assert (
        fairq_metric(server, "fairq_requests_total", tier="interactive", outcome="cancelled") == 2
    )


async def test_cancel_mid_stream_aborts_backend_and_frees_the_slot(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Cancelling a running stream aborts the backend request and frees the backend slot for
    the next queued request."""
    server = await fairq_factory(make_config([sim_backend(slow_sim, max_in_flight=1)]))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        running = generate(ch, gen_request(max_tokens=400), metadata=user("a"))
        await first_chunk(running, Outcome())
        waiting = generate(ch, gen_request(max_tokens=4), metadata=user("b"))
        await read_queued(waiting)
        running.cancel()
        done = await run_call(waiting)
    assert done.code is OK and done.finished is not None
    assert done.backends == ["sim-a"]
    await until(lambda: slow_sim.engine.running_count == 0, what="backend request aborted")
    abort = slow_sim.state.vllm_metrics
    assert abort is not None
    text = abort.render().decode()
    assert (
        'finished_reason="abort"' in text
        and 'finished_reason="abort",model_name="sim"} 1.0' in text
    )
    assert fairq_metric(server, "fairq_backend_in_flight", backend="sim-a") == 0


# -- a backend killed mid-stream ----------------------------------------------------------


@pytest.fixture
async def sim_child() -> AsyncIterator[ChildProcess]:
    """A simulator in its own process (so it can be SIGKILLed), ~10 ms per token."""
    child = await start_sim("--speed", "0.1", "--max-num-seqs", "8")
    try:
        yield child
    finally:
        await child.stop()


async def test_backend_killed_mid_stream_ends_stream_unavailable_and_frees_slot(
    sim_child: ChildProcess, slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """kill -9 of the backend mid-stream: the client keeps the chunks it had, then gets
    UNAVAILABLE naming the backend; fairq's in-flight count on it returns to 0; the other
    backend keeps serving."""
    config = make_config(
        [
            BackendConfig("doomed", "vllm", sim_child.address, ("sim",), max_in_flight=1),
            sim_backend(slow_sim, "survivor"),
        ]
    )
    server = await fairq_factory(config)
    doomed = server.core.backend("doomed")
    assert doomed is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        victim = generate(ch, gen_request(max_tokens=480), metadata=user("v"))
        out = Outcome()
        await first_chunk(victim, out)
        assert out.backends == ["doomed"]
        before = out.chunks
        sim_child.kill()
        await run_call(victim, out)
        assert out.code == grpc.StatusCode.UNAVAILABLE, out
        assert "doomed" in out.details
        assert out.chunks >= before and out.finished is None
        await until(lambda: doomed.in_flight == 0, what="in-flight back to 0")
        assert fairq_metric(server, "fairq_backend_in_flight", backend="doomed") == 0
        await until(lambda: doomed.healthy is False, what="dead backend marked unhealthy")
        after = await run_call(generate(ch, gen_request(), metadata=user("w")))
    assert after.code is OK and after.backends[-1] == "survivor", after


async def test_backend_killed_with_queued_work_moves_it_to_the_other_backend(
    sim_child: ChildProcess, slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Requests queued when a backend dies are served by the other backend of the model."""
    config = make_config(
        [
            BackendConfig("doomed", "vllm", sim_child.address, ("sim",), max_in_flight=1),
            sim_backend(slow_sim, "survivor", max_in_flight=1),
        ]
    )
    server = await fairq_factory(config)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        victim = generate(ch, gen_request(max_tokens=480), metadata=user("v"))
        await first_chunk(victim, Outcome())
        busy = generate(ch, gen_request(max_tokens=40), metadata=user("s"))
        busy_out = Outcome()
        await first_chunk(busy, busy_out)
        assert busy_out.backends == ["survivor"]
        queued = [generate(ch, gen_request(), metadata=user(f"q{i}")) for i in range(3)]
        for call in queued:
            await read_queued(call)
        sim_child.kill()
        victim_out = await run_call(victim)
        await run_call(busy, busy_out)
        outs = await asyncio.gather(*(run_call(c) for c in queued))
    assert victim_out.code == grpc.StatusCode.UNAVAILABLE
    assert busy_out.code is OK
    for out in outs:
        assert out.code is OK, outs
        assert out.backends[-1] == "survivor"


# -- a backend that fails every request before its first token ----------------------------


@pytest.fixture
async def failing_sim() -> AsyncIterator[SimServer]:
    """A simulator answering every generation request with HTTP 500 (metrics stay fine)."""
    async with SimServer(SimConfig(model="sim", speed=20.0, error_rate=1.0)) as s:
        yield s


async def test_failure_before_first_token_is_retried_once_on_the_other_backend(
    failing_sim: SimServer, slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A request whose backend answers 500 before any token runs again on the other backend
    of its model, once; the client sees a normal stream."""
    slow_sim.config.speed = 5.0
    config = make_config([sim_backend(failing_sim, "failing"), sim_backend(slow_sim, "good")])
    server = await fairq_factory(config)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        # Both idle: the tie goes to the first registered backend, the failing one.
        out = await run_call(generate(ch, gen_request(max_tokens=5), metadata=user("a")))
    assert out.code is OK and out.finished is not None, out
    assert out.finished.usage.completion_tokens == 5
    assert out.backends[-1] == "good", out
    assert fairq_metric(server, "fairq_retries_total", backend="failing") == 1
    assert await sim_requests_seen(slow_sim) == 1


async def test_a_retried_request_sends_one_started_event_per_attempt(
    failing_sim: SimServer, slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """As scheduler.proto says: a `started` per backend attempt, the last naming the backend
    that serves, and no text before it."""
    slow_sim.config.speed = 5.0
    config = make_config([sim_backend(failing_sim, "failing"), sim_backend(slow_sim, "good")])
    server = await fairq_factory(config)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        out = await run_call(generate(ch, gen_request(max_tokens=5), metadata=user("a")))
    assert out.code is OK and fairq_metric(server, "fairq_retries_total", backend="failing") == 1
    assert out.backends == ["failing", "good"], out
    assert out.kinds[: out.kinds.index("chunk")].count("started") == 2, out


async def test_retry_happens_once_then_the_error_reaches_the_client(
    failing_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """When the retry fails as well, the client gets the backend's failure as UNAVAILABLE:
    one retry, not a loop."""
    async with SimServer(SimConfig(model="sim", error_rate=1.0)) as other:
        config = make_config([sim_backend(failing_sim, "f1"), sim_backend(other, "f2")])
        server = await fairq_factory(config)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            out = await run_call(generate(ch, gen_request(), metadata=user("a")))
    assert out.code == grpc.StatusCode.UNAVAILABLE, out
    assert "HTTP 500" in out.details and "Simulated engine failure" in out.details
    assert sorted(out.backends) == ["f1", "f2"]
    dispatched = sum(
        fairq_metric(server, "fairq_dispatches_total", backend=b, tier="interactive")
        for b in ("f1", "f2")
    )
    assert dispatched == 2


async def test_retry_goes_ahead_of_requests_queued_before_it() -> None:
    """A retried request is served before requests that were queued while it ran.

    One scripted backend with room for one request: the first request fails with HTTP 500
    only once two more are queued behind it; the backend must then receive it again before
    either of them.
    """
    release = asyncio.Event()
    good = sse_reply(*completion_events(["a", "b"]))

    async def reply(body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        if body.get("prompt") == "first" and not release.is_set():
            await release.wait()
            await raw_reply(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n"
                b"connection: close\r\n\r\nboom"
            )(body, writer)
            return
        await good(body, writer)

    async with ScriptedBackend(reply) as backend:
        server = FairqServer(
            make_config([BackendConfig("scripted", "vllm", backend.url, ("m",), max_in_flight=1)])
        )
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                first = generate(ch, gen_request("first", model="m"), metadata=user("a"))
                await read_queued(first)
                await until(lambda: len(backend.requests) == 1, what="first request sent")
                later = []
                for i in range(2):  # one after the other: the order they are queued in
                    call = generate(ch, gen_request(f"later{i}", model="m"), metadata=user(f"b{i}"))
                    await read_queued(call)
                    later.append(call)
                release.set()
                outs = await asyncio.gather(run_call(first), *(run_call(c) for c in later))
        finally:
            await server.stop(grace=0.5)
    assert all(o.code is OK for o in outs), outs
    prompts = [r.get("prompt") for r in backend.requests]
    assert prompts == ["first", "first", "later0", "later1"]
    assert fairq_metric(server, "fairq_retries_total", backend="scripted") == 1


async def test_retry_waits_for_the_other_backend_instead_of_the_failing_one(
    failing_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """With one backend failing every request and the other busy, no request fails: each is
    retried on the other backend once it has room."""
    async with SimServer(SimConfig(model="sim", speed=20.0, max_num_seqs=4)) as good:
        config = make_config([sim_backend(failing_sim, "failing"), sim_backend(good, "good")])
        server = await fairq_factory(config)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            calls = [
                generate(ch, gen_request(max_tokens=20), metadata=user(f"u{i % 4}"))
                for i in range(12)
            ]
            outs = await asyncio.gather(*(run_call(c) for c in calls))
    failed = [o for o in outs if o.code is not OK]
    assert not failed, f"{len(failed)} of {len(outs)} failed, e.g. {failed[0]}"


async def test_a_retry_waiting_for_another_backend_does_not_idle_the_first_one(
    slow_sim: SimServer,
) -> None:
    """Backend A fails request R once and is fine otherwise; B is busy for a while. R waits
    for B, as it should, but Q0 and Q1, queued behind R, could run on A at once: the
    project's point is not to cost backend throughput."""
    release = asyncio.Event()
    good = sse_reply(*completion_events(["a", "b"]))

    async def reply(body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        if body.get("prompt") == "R" and not release.is_set():
            await release.wait()
            await raw_reply(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n"
                b"connection: close\r\n\r\nbusy"
            )(body, writer)
            return
        await good(body, writer)

    slow_sim.config.speed = 0.1  # B's blocker S runs ~3 s
    async with ScriptedBackend(reply) as a:
        backends = [
            BackendConfig("A", "vllm", a.url, ("sim",), max_in_flight=1),
            sim_backend(slow_sim, "B", max_in_flight=1),
        ]
        server = FairqServer(make_config(backends))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                r = generate(ch, gen_request("R"), metadata=user("r"))
                await until(lambda: len(a.requests) == 1, what="R at backend A")
                s = generate(ch, gen_request("S", max_tokens=300), metadata=user("s"))
                s_out = Outcome()
                await first_chunk(s, s_out)
                queued = [generate(ch, gen_request(f"Q{i}"), metadata=user(f"q{i}"))
                          for i in range(2)]  # fmt: skip
                for call in queued:
                    await read_queued(call)
                release.set()
                started = time.monotonic()
                q_outs = await asyncio.gather(*(run_call(c) for c in queued))
                waited = time.monotonic() - started
                await asyncio.gather(run_call(r), run_call(s, s_out))
        finally:
            await server.stop(grace=0.5)
    assert all(o.code is OK and o.backends == ["A"] for o in q_outs), q_outs
    # A is healthy again within one scrape (50 ms): Q0 and Q1 need not wait for S.
    assert waited < 1.0, f"Q0 and Q1 waited {waited:.1f} s with backend A idle"


# -- metrics that fail or come too late ---------------------------------------------------


async def test_failing_metrics_fail_closed_for_that_backend_only(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A backend whose /metrics answers 500 gets no work (its snapshot goes stale from the
    first failed scrape; after `unhealthy_after_failures` (2) in a row the gate refuses it as
    unhealthy) while the other backend serves everything; it gets work again once it
    recovers."""
    slow_sim.config.speed = 5.0
    async with SimServer(SimConfig(model="sim", speed=5.0)) as sick:
        config = make_config(
            [sim_backend(sick, "sick"), sim_backend(slow_sim, "well")], stale_after_seconds=0.3
        )
        server = await fairq_factory(config)
        sick.config.metrics_fail = True
        await until(lambda: fairq_metric(server, "fairq_backend_healthy", backend="sick") == 0,
                    what="sick backend unhealthy")  # fmt: skip
        await until(lambda: snapshot_age(server, "sick") > 0.3, what="sick snapshot stale")
        sent_before = await sim_requests_seen(sick)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            calls = [generate(ch, gen_request(), metadata=user(f"u{i}")) for i in range(6)]
            async with asyncio.timeout(20):  # a stuck dispatcher would hang here
                outs = await asyncio.gather(*(run_call(c) for c in calls))
            assert all(o.code is OK and o.backends == ["well"] for o in outs), outs
            assert await sim_requests_seen(sick) == sent_before
            sick_state = server.core.backend("sick")
            assert sick_state is not None
            dispatcher = server.core.dispatcher
            verdict = dispatcher.policies.gate.check(
                sick_state, dispatcher.tiers[0], time.monotonic(), 0.3
            )
            assert verdict is GateOutcome.UNHEALTHY, verdict
            assert fairq_metric(server, "fairq_backend_healthy", backend="well") == 1

            sick.config.metrics_fail = False
            await until(lambda: fairq_metric(server, "fairq_backend_healthy", backend="sick") == 1,
                        what="sick backend healthy again")  # fmt: skip
            # Both idle again: the tie goes to the first registered backend.
            back = await run_call(generate(ch, gen_request(), metadata=user("x")))
    assert back.code is OK and back.backends == ["sick"], back


async def test_slow_metrics_fail_closed_without_stalling_the_dispatcher(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Metrics that answer, but later than stale_after: the snapshot is always stale, so that
    backend gets nothing; the dispatcher does not wait on the scrape and the other backend
    keeps its usual latency."""
    slow_sim.config.speed = 5.0
    async with SimServer(SimConfig(model="sim", speed=5.0)) as slow:
        config = make_config(
            [sim_backend(slow, "slow"), sim_backend(slow_sim, "well")],
            stale_after_seconds=0.3,
            scrape_timeout_seconds=LATE_SCRAPE_TIMEOUT,
        )
        server = await fairq_factory(config)
        slow.config.metrics_delay = LATE_METRICS
        await until(lambda: snapshot_age(server, "slow") > 0.3, what="slow snapshot stale")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            started = time.monotonic()
            calls = [generate(ch, gen_request(), metadata=user(f"u{i}")) for i in range(6)]
            outs = await asyncio.gather(*(run_call(c) for c in calls))
            elapsed = time.monotonic() - started
        # The gate's own verdict on the slow backend. (The refusal counter only counts when no
        # backend admits, so whether it moves depends on how fast "well" starts the six.)
        dispatcher = server.core.dispatcher
        slow_state = server.core.backend("slow")
        assert slow_state is not None
        verdict = dispatcher.policies.gate.check(
            slow_state, dispatcher.tiers[0], time.monotonic(), 0.3
        )
        # The scrapes succeed: the backend counts as healthy, it is only ever too late.
        assert fairq_metric(server, "fairq_backend_healthy", backend="slow") == 1
    assert all(o.code is OK and o.backends == ["well"] for o in outs), outs
    # Six 8-token requests on an idle 5x simulator take well under a second; a dispatcher
    # blocked behind 0.45 s scrapes would take several.
    assert elapsed < 3.0, elapsed
    assert verdict is GateOutcome.STALE, verdict
    assert fairq_metric(server, "fairq_dispatches_total", backend="slow", tier="interactive") == 0


async def test_list_backends_reports_a_backend_with_stale_metrics_as_not_healthy(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """An operator asking ListBackends sees what the gate sees: a backend whose metrics
    always arrive later than stale_after is not healthy, though each scrape succeeds; once
    its metrics are fresh again it is listed healthy again."""
    config = make_config(
        [sim_backend(slow_sim, "slow")],
        stale_after_seconds=0.3,
        scrape_timeout_seconds=LATE_SCRAPE_TIMEOUT,
    )
    server = await fairq_factory(config)
    entry = server.core.backend("slow")
    assert entry is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        slow_sim.config.metrics_delay = LATE_METRICS
        await until(lambda: snapshot_age(server, "slow") > 0.3, what="slow snapshot stale")
        stale = await admin.ListBackends(admin_pb2.ListBackendsRequest(), timeout=10)
        scrapes_succeeding = entry.healthy is True and entry.failures == 0
        slow_sim.config.metrics_delay = 0.0

        async def listed_healthy() -> bool:
            # Polled every 50 ms, the snapshot is fresh again within a few polls; on a loaded
            # machine one answer may still be built from a sample a stall made old.
            answer = await admin.ListBackends(admin_pb2.ListBackendsRequest(), timeout=10)
            return answer.backends[0].healthy

        await until_async(listed_healthy, what="listed healthy once its metrics are fresh")
    assert [b.backend.id for b in stale.backends] == ["slow"]
    assert scrapes_succeeding  # not the scrape's failure: only its age
    assert not stale.backends[0].healthy


async def test_metrics_slower_than_the_scrape_timeout_mark_the_backend_unhealthy(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A scrape that does not answer within its timeout counts as failed (healthy = 0)."""
    slow_sim.config.speed = 5.0
    async with SimServer(SimConfig(model="sim", speed=5.0)) as slow:
        config = make_config([sim_backend(slow, "slow"), sim_backend(slow_sim, "well")])
        server = await fairq_factory(config)
        slow.config.metrics_delay = 5.0
        await until(lambda: fairq_metric(server, "fairq_backend_healthy", backend="slow") == 0,
                    what="slow backend unhealthy")  # fmt: skip
        assert fairq_metric(server, "fairq_backend_scrape_failures_total", backend="slow") >= 1
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            out = await run_call(generate(ch, gen_request(), metadata=user("a")))
        slow.config.metrics_delay = 0.0
    assert out.code is OK and out.backends == ["well"], out


async def test_all_backends_failing_metrics_rejects_new_requests_unavailable(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """With no healthy backend for the model a new request is refused UNAVAILABLE at once."""
    server = await fairq_factory(make_config([sim_backend(slow_sim)]))
    slow_sim.config.metrics_fail = True
    await until(lambda: fairq_metric(server, "fairq_backend_healthy", backend="sim-a") == 0,
                what="backend unhealthy")  # fmt: skip
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        out = await run_call(generate(ch, gen_request(), metadata=user("a"), timeout=5))
    assert out.code == grpc.StatusCode.UNAVAILABLE, out
    assert "no healthy backend serves model 'sim'" in out.details


async def test_a_hung_backend_absorbs_at_most_its_gate_and_the_rest_go_elsewhere(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A backend that accepts requests and never answers them, while its metrics look idle
    (an engine hang behind a live HTTP server): fairq's own count of requests without a first
    token closes its gate after `max_backend_waiting` (3), so every other request is served
    by the healthy backend, and the stuck ones end with the client's deadline."""
    hang = asyncio.Event()

    async def never(body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        await hang.wait()  # released only at the end of the test

    slow_sim.config.speed = 5.0
    async with ScriptedBackend(never) as hung:
        config = make_config(
            [BackendConfig("hung", "vllm", hung.url, ("sim",)), sim_backend(slow_sim, "well")]
        )
        server = await fairq_factory(config)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            calls = [
                generate(ch, gen_request(), metadata=user(f"u{i}"), timeout=2) for i in range(12)
            ]
            outs = await asyncio.gather(*(run_call(c) for c in calls))
        entry = server.core.backend("hung")
        assert entry is not None
        await until(lambda: entry.in_flight == 0, what="stuck slots released")
        hang.set()
    stuck = [o for o in outs if o.code is not OK]
    assert len(hung.requests) == 3, hung.requests
    assert len(stuck) == 3 and all(o.backends == ["hung"] for o in stuck), stuck
    assert all(o.code == grpc.StatusCode.DEADLINE_EXCEEDED for o in stuck), stuck
    assert all(o.backends == ["well"] for o in outs if o.code is OK)


# -- a backend that answers garbage -------------------------------------------------------


def _data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


GARBAGE = {
    "invalid-json": sse_reply(b"data: {not json\n\n"),
    "json-array": sse_reply(b"data: [1, 2]\n\n"),
    "error-event": sse_reply(_data({"error": {"message": "engine on fire"}})),
    "non-utf8": sse_reply(b"data: \xff\xfe\xfd\n\n"),
    "not-http": raw_reply(b"\x00\x01garbage that is not HTTP\r\n\r\n"),
    "http-400-html": raw_reply(
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/html\r\ncontent-length: 13\r\n\r\n"
        b"<html></html>"
    ),
}

# Valid JSON of the wrong shape: the adapter trusts the shape and fails outside its error
# translation, so the client sees UNKNOWN with a Python exception text.
WRONG_SHAPE = {
    "choices-string": sse_reply(_data({"choices": "abc"})),
    "choices-null-item": sse_reply(_data({"choices": [None]})),
    "text-number": sse_reply(_data({"choices": [{"text": 5}]})),
    "usage-string": sse_reply(
        _data({"choices": [{"text": "hi"}], "usage": {"prompt_tokens": "many"}})
    ),
}


async def _garbage_case(
    reply: object,
    fairq_factory: FairqFactory,
    sim: SimServer,
    backend_done: asyncio.Event | None = None,
) -> Outcome:
    """Send one request to the scripted ``bad`` backend and three to ``sim`` beside it.

    Returns the bad request's outcome, once the good ones finished normally and the bad
    backend's slot was released (and ``backend_done`` was set, if given).
    """
    async with ScriptedBackend(reply) as bad:  # type: ignore[arg-type]
        config = make_config(
            [BackendConfig("bad", "vllm", bad.url, ("bad",)), sim_backend(sim, "good")]
        )
        server = await fairq_factory(config)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            good_calls = [
                generate(ch, gen_request(max_tokens=30), metadata=user(f"g{i}")) for i in range(3)
            ]
            bad_out, *good_outs = await asyncio.gather(
                run_call(generate(ch, gen_request(model="bad"), metadata=user("b"),
                                           timeout=20)),
                *(run_call(c) for c in good_calls),
            )  # fmt: skip
        if backend_done is not None:
            async with asyncio.timeout(10):
                await backend_done.wait()
        entry = server.core.backend("bad")
        assert entry is not None
        await until(lambda: entry.in_flight == 0, what="bad backend slot released")
    for out in good_outs:
        assert out.code is OK and out.finished is not None, out
        assert out.finished.usage.completion_tokens == 30
    assert bad.requests, "the garbage backend was asked"
    return bad_out


@pytest.mark.parametrize("case", sorted(GARBAGE))
async def test_garbage_from_a_backend_is_a_clear_error_for_that_client_only(
    case: str, slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Malformed SSE, JSON or HTTP from a backend: that client gets an error status naming the
    backend; clients of other backends finish normally; the slot is released."""
    slow_sim.config.speed = 5.0
    out = await _garbage_case(GARBAGE[case], fairq_factory, slow_sim)
    assert out.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.INVALID_ARGUMENT), out  # fmt: skip
    assert "backend bad" in out.details, out
    assert out.finished is None


@pytest.mark.parametrize("case", sorted(WRONG_SHAPE))
async def test_wrong_shaped_json_from_a_backend_is_a_clear_error(
    case: str, slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    slow_sim.config.speed = 5.0
    out = await _garbage_case(WRONG_SHAPE[case], fairq_factory, slow_sim)
    assert out.code != grpc.StatusCode.UNKNOWN, out
    assert "backend bad" in out.details, out


async def test_stream_cut_cleanly_without_done_is_not_reported_as_finished(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A 200 stream that stops after some text, with no finish_reason and no [DONE] (a proxy
    closing the chunked body cleanly when its upstream died), is a failure, not a success."""
    slow_sim.config.speed = 5.0
    cut = sse_reply(_data({"choices": [{"text": "half an ans"}]}))
    out = await _garbage_case(cut, fairq_factory, slow_sim)
    assert out.code != OK, out


async def test_an_endless_line_fails_that_client_only_and_fairq_hangs_up(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A backend that starts an SSE line and never ends it, as fast as the socket takes it
    (unbounded, it would grow fairq's memory until the deadline): that client gets INTERNAL
    naming the backend and the line limit, fairq closes the connection once the line passes
    the limit, and the other backend's clients finish normally."""
    slow_sim.config.speed = 5.0
    hung_up = asyncio.Event()
    sent = 0

    async def endless(body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        start = _data({"choices": [{"text": "a"}]}) + b'data: {"choices":[{"text":"'
        writer.write(head + b"%x\r\n%s\r\n" % (len(start), start))
        piece = b"x" * 65536
        try:
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                sent += len(piece)
        except ConnectionError:
            hung_up.set()

    bad_out = await _garbage_case(endless, fairq_factory, slow_sim, backend_done=hung_up)
    assert bad_out.code == grpc.StatusCode.INTERNAL, bad_out
    assert "backend bad" in bad_out.details and "1048576 characters" in bad_out.details
    assert bad_out.text == "a" and bad_out.finished is None  # what came before was relayed
    # fairq stopped reading after ~1 MiB; what else was sent sat in socket buffers.
    assert sent < 64 * 1024 * 1024, sent


# -- SIGTERM on `fairq serve` -------------------------------------------------------------


def _serve_config(sim: SimServer) -> str:
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\npoll_interval_seconds = 0.05\n"
        "[[backends]]\n"
        f'id = "sim-a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
        "max_in_flight = 1\n"
    )


async def _health(ch: grpc.aio.Channel) -> int:
    health = health_pb2_grpc.HealthStub(ch)
    try:
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
    except grpc.aio.AioRpcError:
        return -1
    return int(reply.status)


async def test_sigterm_drains_running_streams_fails_queued_and_exits_zero(
    slow_sim: SimServer,
) -> None:
    """SIGTERM: health turns NOT_SERVING and new requests are refused, the running stream
    finishes within the grace period, queued requests get UNAVAILABLE, exit status 0, and
    nothing is left in the process group."""
    slow_sim.config.speed = 0.2  # ~6 ms per token: 150 tokens ~ 1 s
    fairq = await start_fairq(_serve_config(slow_sim), grace=10.0)
    try:
        async with grpc.aio.insecure_channel(fairq.address) as ch:
            running = generate(ch, gen_request(max_tokens=150), metadata=user("r"))
            running_out = Outcome()
            await first_chunk(running, running_out)
            queued = [generate(ch, gen_request(), metadata=user(f"q{i}")) for i in range(2)]
            for call in queued:
                await read_queued(call)
            signalled = time.monotonic()
            fairq.signal(signal.SIGTERM)
            queued_outs = await asyncio.gather(*(run_call(c) for c in queued))
            refused = await run_call(generate(ch, gen_request(), metadata=user("late"), timeout=5))
            await run_call(running, running_out)
            status = await fairq.wait(timeout=15)
            elapsed = time.monotonic() - signalled
    finally:
        await fairq.stop()
    for out in queued_outs:
        assert out.code == grpc.StatusCode.UNAVAILABLE, out
        assert "shutting down" in out.details
    assert refused.code == grpc.StatusCode.UNAVAILABLE, refused
    assert running_out.code is OK and running_out.finished is not None, running_out
    assert running_out.finished.usage.completion_tokens == 150
    assert status == 0, fairq.stderr_tail()
    assert elapsed < 10.0  # it did not sit out the whole grace period
    assert not process_group_alive(fairq.pid)


async def test_sigterm_cuts_streams_longer_than_the_grace_period(slow_sim: SimServer) -> None:
    """A stream still running when the grace period ends is cut (the client gets an error,
    the backend request is aborted) and fairq still exits 0 soon after the grace period."""
    fairq = await start_fairq(_serve_config(slow_sim), grace=1.0)
    try:
        async with grpc.aio.insecure_channel(fairq.address) as ch:
            assert await _health(ch) == health_pb2.HealthCheckResponse.SERVING
            running = generate(ch, gen_request(max_tokens=480), metadata=user("r"))
            out = Outcome()
            await first_chunk(running, out)
            signalled = time.monotonic()
            fairq.signal(signal.SIGTERM)
            await run_call(running, out)
            status = await fairq.wait(timeout=15)
            elapsed = time.monotonic() - signalled
    finally:
        await fairq.stop()
    assert out.code != OK and out.finished is None, out
    assert status == 0, fairq.stderr_tail()
    assert elapsed < 5.0, elapsed
    assert not process_group_alive(fairq.pid)
    await until(lambda: slow_sim.engine.running_count == 0, what="backend request aborted")


async def test_sim_child_restart_on_same_port_is_picked_up_again(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A backend that dies and comes back on the same address serves again, without any
    Admin call: health follows the scrapes."""
    first = await start_sim("--speed", "5")
    port = first.address.rsplit(":", 1)[1]
    server = await fairq_factory(make_config([BackendConfig("phoenix", "vllm", first.address,
                                                            ("sim",))]))  # fmt: skip
    first.kill()
    await first.stop()
    await until(lambda: fairq_metric(server, "fairq_backend_healthy", backend="phoenix") == 0,
                what="dead backend unhealthy")  # fmt: skip
    second = await start_sim("--speed", "5", port=int(port))
    try:
        await until(lambda: fairq_metric(server, "fairq_backend_healthy", backend="phoenix") == 1,
                    what="restarted backend healthy")  # fmt: skip
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            out = await run_call(generate(ch, gen_request(), metadata=user("a")))
    finally:
        await second.stop()
    assert out.code is OK and out.backends == ["phoenix"], out


# -- start-up with a configuration that cannot work -----------------------------------------

UNUSABLE_CONFIGS = {
    "unknown-policy": '[scheduler]\nfairness = "nope"\n',
    "backend-bad-port": (
        '[[backends]]\nid = "x"\nkind = "vllm"\nbase_url = "http://127.0.0.1:abc"\nmodels = ["m"]\n'
    ),
    "backend-ftp": (
        '[[backends]]\nid = "x"\nkind = "vllm"\nbase_url = "ftp://127.0.0.1:1"\nmodels = ["m"]\n'
    ),
    "tls-files-missing": '[tls]\ncert_file = "/nonexistent.crt"\nkey_file = "/nonexistent.key"\n',
}


@pytest.mark.parametrize("case", sorted(UNUSABLE_CONFIGS))
async def test_serve_refuses_an_unusable_configuration_with_a_message(
    case: str, tmp_path: Path
) -> None:
    """`fairq serve` with a configuration that cannot work exits 2 with one line saying why,
    as it does for a file it cannot parse; not with a Python traceback."""
    path = tmp_path / "fairq.toml"
    path.write_text('listen = "127.0.0.1:0"\n' + UNUSABLE_CONFIGS[case])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairq_server", "serve", "--config", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, process_group=0,
    )  # fmt: skip
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode == 2, err.decode()[-500:]
    assert b"Traceback" not in err
    # Start-up lines at INFO (the store opened) may come first; the refusal is one line.
    problems = [line for line in err.decode().splitlines() if " INFO " not in line]
    assert problems and problems[0].startswith("fairq: "), err
