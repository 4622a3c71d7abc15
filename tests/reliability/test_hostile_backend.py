"""A backend that misbehaves on purpose (:class:`HostileBackend`), one behaviour per case.

Every byte fairq reads from a backend is bounded and every value validated: a ``/metrics``
or error body that never ends is cut at its limit, a NaN or negative metric fails the scrape
(fail closed), malformed usage is INTERNAL for that request only and nothing of a Python
exception reaches the client, and nothing a backend sends can start a line in fairq's log.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from fairq_bench.hostile_backend import HostileBackend
from fairq_server.app import FairqServer
from fairq_server.backends.base import Backend
from fairq_server.backends.request import BackendRequest, MetricsSample, StreamEvent
from fairq_server.config.schema import BackendConfig
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .helpers import fairq_metric, gen_request, generate, run_call, until

MiB = 1024 * 1024
CAP = 1 * MiB  # scheduler.max_metrics_bytes in these tests

# /metrics behaviours. Each one must leave the backend unhealthy (never admitted) with a
# failed scrape whose recorded error says why.
METRICS_CASES = {
    # item 1: a body that never ends, chunked or with a declared length it never sends
    "endless": "larger than 1048576 bytes",
    "declared-huge": "larger than 1048576 bytes",
    # a small body dribbled for ever: the scrape's total time is bounded
    "dribble": "metrics unreachable",
    "silent": "metrics unreachable",
    # item 13: values no exporter should export fail the scrape (fail closed)
    "nan": "vllm:num_requests_waiting is nan",
    "negative": "vllm:num_requests_running is -1.0",
    "infinite": "vllm:num_requests_waiting is inf",
}


@pytest.fixture
async def hostile() -> AsyncIterator[HostileBackend]:
    async with HostileBackend() as backend:
        yield backend


async def _bad_fairq(
    factory: FairqFactory, hostile: HostileBackend, sim: SimServer, kind: str = "vllm"
) -> FairqServer:
    """fairq with backend ``bad`` (model ``bad``) on ``hostile`` and ``good`` on ``sim``."""
    config = make_config(
        [BackendConfig("bad", kind, hostile.url, ("bad",)), sim_backend(sim, "good")],
        max_metrics_bytes=CAP,
        max_error_body_bytes=4096,
    )
    return await factory(config)


@pytest.mark.parametrize("mode", sorted(METRICS_CASES))
async def test_a_bad_metrics_answer_is_a_failed_scrape_and_the_backend_gets_no_work(
    mode: str, hostile: HostileBackend, sim: SimServer, fairq_factory: FairqFactory
) -> None:
    hostile.metrics = mode
    server = await _bad_fairq(fairq_factory, hostile, sim)
    entry = server.core.backend("bad")
    assert entry is not None
    await until(lambda: entry.failures >= 2, what="two failed scrapes")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        bad = await run_call(generate(ch, gen_request(model="bad"), timeout=10))
        good = await run_call(generate(ch, gen_request(model="sim", max_tokens=4), timeout=10))
    assert METRICS_CASES[mode] in entry.last_error, entry.last_error
    assert entry.healthy is False
    assert bad.code == grpc.StatusCode.UNAVAILABLE, bad
    assert hostile.posts == 0  # fail closed: not one request reached it
    assert good.code == grpc.StatusCode.OK and good.finished is not None, good
    assert fairq_metric(server, "fairq_backend_scrape_failures_total", backend="bad") >= 2
    # What fairq read is bounded by the cap, whatever the backend offered (before the cap,
    # each scrape read for its whole timeout: hundreds of MiB at loopback speed).
    assert hostile.sent <= hostile.scrapes * (CAP + 8 * MiB), (hostile.sent, hostile.scrapes)


# Generation answers: (backend kind, expected status, text the details must contain).
GENERATE_CASES = {
    # item 2: an error body that never ends (chunked, or a declared length never sent)
    "error-endless": ("vllm", grpc.StatusCode.UNAVAILABLE, "answered HTTP 500"),
    "error-declared-huge": ("vllm", grpc.StatusCode.UNAVAILABLE, "answered HTTP 500"),
    # item 6: usage fairq cannot count; a TGI stream missing fields
    "usage-negative": ("vllm", grpc.StatusCode.INTERNAL, "backend bad: unexpected stream"),
    # Infinity is not JSON: refused by the decoder, before the usage is read.
    "usage-infinity": ("vllm", grpc.StatusCode.INTERNAL, "backend bad: malformed stream event"),
    "usage-huge": ("vllm", grpc.StatusCode.INTERNAL, "backend bad: unexpected stream"),
    "usage-fraction": ("vllm", grpc.StatusCode.INTERNAL, "backend bad: unexpected stream"),
    "usage-string": ("vllm", grpc.StatusCode.INTERNAL, "backend bad: unexpected stream"),
    "tgi-no-text": ("tgi", grpc.StatusCode.INTERNAL, "backend bad: unexpected stream"),
    "tgi-no-generated-tokens": ("tgi", grpc.StatusCode.INTERNAL, "backend bad: unexpected"),
    # item 8: text meant to forge a log line
    "error-injection": ("vllm", grpc.StatusCode.UNAVAILABLE, "FORGED http line"),
    "event-injection": ("vllm", grpc.StatusCode.INTERNAL, "FORGED event line"),
}
# Python's words for what went wrong: none may reach a client.
EXCEPTION_WORDS = ("Error", "Traceback", "int()", "KeyError", "float", "OverflowError")


@pytest.mark.parametrize("mode", sorted(GENERATE_CASES))
async def test_a_bad_generation_answer_fails_that_request_only_with_a_clear_status(
    mode: str,
    hostile: HostileBackend,
    sim: SimServer,
    fairq_factory: FairqFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kind, code, needle = GENERATE_CASES[mode]
    hostile.generate = mode
    server = await _bad_fairq(fairq_factory, hostile, sim, kind)
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        bad = await run_call(generate(ch, gen_request(model="bad"), timeout=20))
        good = await run_call(generate(ch, gen_request(model="sim", max_tokens=4), timeout=10))
    entry = server.core.backend("bad")
    assert entry is not None
    await until(lambda: entry.in_flight == 0, what="bad backend slot released")
    assert bad.code == code, bad
    assert needle in bad.details, bad
    assert "\n" not in bad.details and "\r" not in bad.details, bad
    assert not any(word in bad.details for word in EXCEPTION_WORDS), bad
    assert bad.finished is None
    assert good.code == grpc.StatusCode.OK and good.finished is not None, good
    outcome = code.name.lower()
    assert fairq_metric(server, "fairq_requests_total", tier="interactive", outcome=outcome) == 1
    assert (
        fairq_metric(server, "fairq_requests_total", tier="interactive", outcome="cancelled") == 0
    )
    # Every log line is one line: backend text is escaped where it enters a message.
    assert all("\n" not in r.getMessage() for r in caplog.records), caplog.text
    if mode.startswith("error-"):
        # fairq read at most a prefix of each error body (4 KiB here), then hung up.
        assert hostile.sent <= hostile.posts * 8 * MiB, (hostile.sent, hostile.posts)


class _BrokenAdapter(Backend):
    """An adapter with a bug: its stream raises what no adapter translates."""

    kind = "vllm"

    def parse_metrics(self, text: str) -> MetricsSample:
        return MetricsSample(waiting=0.0, running=0.0)

    async def stream(self, request: BackendRequest, priority: int) -> AsyncIterator[StreamEvent]:
        raise RuntimeError("secret internals at 0xdeadbeef")
        yield  # pragma: no cover - makes this an async generator


async def test_an_exception_escaping_an_adapter_is_internal_error_logged_once(
    hostile: HostileBackend, fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever escapes the adapter boundary: INTERNAL "internal error" for that request,
    nothing of the exception in the status, one ERROR record with the trace, counted under
    ``internal`` (it used to be UNKNOWN with the exception text, counted as ``cancelled``)."""
    server = await fairq_factory(make_config())
    cfg = BackendConfig("broken", "vllm", hostile.url, ("m",))
    await server.core.register_backend(cfg, backend=_BrokenAdapter("broken", hostile.url, ["m"]))
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        out = await run_call(generate(ch, gen_request(model="m"), timeout=10))
    assert out.code == grpc.StatusCode.INTERNAL, out
    assert out.details == "internal error"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert errors[0].exc_info is not None and "secret internals" in str(errors[0].exc_info[1])
    assert fairq_metric(server, "fairq_requests_total", tier="interactive", outcome="internal") == 1
    assert (
        fairq_metric(server, "fairq_requests_total", tier="interactive", outcome="cancelled") == 0
    )
