"""The ext_proc door's parts without Envoy: the carrier's end, answers, the bootstrap's YAML."""

from __future__ import annotations

import asyncio

import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from fairq_server.backends.request import BackendRequest, StreamEnd, TextDelta
from fairq_server.doors.extproc.bootstrap import EnvoySetup, bootstrap, to_yaml
from fairq_server.doors.extproc.carrier import BYTES_PER_TOKEN, EnvoyCarrier, Usage
from fairq_server.doors.extproc.door import _kind, _later
from fairq_server.scheduling.ticket import Ticket


class _Backend:
    id = "b"
    tpot_seconds: float | None = None


def ticket() -> Ticket:
    t = Ticket(request=BackendRequest(model="m", prompt="hi"), user="u", tier=0, prompt_tokens=7)
    t.backend = _Backend()  # type: ignore[assignment]
    return t


async def events(carrier: EnvoyCarrier, t: Ticket, *then: object) -> list[object]:
    stream = carrier.stream(t)
    assert carrier.dispatched.done()  # told as the launcher starts the attempt
    out = []
    reader = asyncio.ensure_future(_drain(stream, out))
    await asyncio.sleep(0)
    for step in then:
        step()  # type: ignore[operator]
        await asyncio.sleep(0.01)
    await asyncio.wait_for(reader, 5)
    return out


async def _drain(stream: object, out: list[object]) -> None:
    async for event in stream:  # type: ignore[attr-defined]
        out.append(event)


async def test_the_usage_reported_ends_the_stream_after_its_first_byte() -> None:
    carrier, t = EnvoyCarrier(grace=1.0, max_seconds=10), ticket()
    got = await events(
        carrier, t, carrier.first_byte,
        lambda: carrier.report(Usage(8, 12, 200, 3000, client_left=False)),
    )  # fmt: skip
    assert got == [TextDelta("", tokens=0), StreamEnd("stop", 8, 12)]


async def test_a_request_near_its_bound_at_the_engines_pace_counts_its_tokens() -> None:
    carrier, t = EnvoyCarrier(grace=1.0, max_seconds=10), ticket()
    t.max_tokens = 26
    t.backend.tpot_seconds = 0.001  # type: ignore[union-attr]
    got = await events(
        carrier, t, carrier.first_byte,
        lambda: carrier.report(Usage(8, 26, 200, 3000, client_left=False)),
    )  # fmt: skip
    # 10 tokens (26 less the lookahead's 16) take 10 ms at the engine's pace: then the
    # request counts as within the lookahead of its end, with those tokens charged.
    assert got == [TextDelta("", tokens=0), TextDelta("", tokens=10), StreamEnd("stop", 8, 26)]


async def test_a_client_gone_is_charged_an_estimate_from_the_bytes() -> None:
    carrier, t = EnvoyCarrier(grace=1.0, max_seconds=10), ticket()
    got = await events(
        carrier, t, carrier.first_byte,
        lambda: carrier.report(Usage(None, None, 200, 10 * BYTES_PER_TOKEN, client_left=True)),
    )  # fmt: skip
    assert got[-1] == StreamEnd("cancelled", 7, 10)


async def test_a_refusal_by_the_backend_charges_no_completion() -> None:
    carrier, t = EnvoyCarrier(grace=1.0, max_seconds=10), ticket()
    got = await events(carrier, t, lambda: carrier.report(Usage(None, None, 400, 200, False)))
    assert got == [StreamEnd("error", 7, 0)]


async def test_closed_without_a_report_ends_after_the_grace() -> None:
    carrier, t = EnvoyCarrier(grace=0.05, max_seconds=10), ticket()
    got = await events(carrier, t, carrier.closed)
    assert got == [StreamEnd("unreported", 7, 0)]


async def test_never_told_anything_ends_at_the_bound() -> None:
    carrier, t = EnvoyCarrier(grace=1.0, max_seconds=0.05), ticket()
    assert await events(carrier, t) == [StreamEnd("unreported", 7, 0)]


def test_paths_and_later_messages() -> None:
    assert _kind("/v1/chat/completions") == "chat"
    assert _kind("/v1/completions?x=1") == "completion"
    assert _kind("/v1/embeddings") is None

    async def run() -> None:
        carrier = EnvoyCarrier(grace=1.0, max_seconds=10)
        body = b'data: {"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\ndata: [DONE]\n\n'
        message = pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=True))
        answer = _later(message, carrier, duplex=True)
        assert answer is not None
        assert answer.response_body.response.body_mutation.streamed_response.body == body
        assert carrier._usage == Usage(3, 5, 200, 0, client_left=False)
        headers = _later(pb.ProcessingRequest(response_headers=pb.HttpHeaders()), carrier, False)
        assert headers is not None and headers.HasField("response_headers")
        assert carrier._first.is_set()

    asyncio.run(run())


def test_the_bootstrap_is_yaml_that_reads_back_as_built() -> None:
    doc = bootstrap(EnvoySetup("0.0.0.0:8080", [("r-0", "10.0.0.1:9002")], 125.0))
    assert yaml.safe_load(to_yaml(doc)) == doc
