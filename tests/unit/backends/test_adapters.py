"""Adapter edge cases against scripted loopback servers: recorded vLLM streams, error shapes,
bad SSE."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NoReturn

import grpc
import pytest
from aiohttp import web

from fairq_server.backends.request import BackendRequest, Sampling, StreamEnd, TextDelta
from fairq_server.backends.sse import MAX_EVENT_CHARS
from fairq_server.backends.tgi import TgiBackend
from fairq_server.backends.vllm import VllmBackend
from fairq_server.doors.grpc.status import status_for
from fairq_server.errors import BackendError

from ...scripted_http import Handler, reply, serve, sse, unused_url

FIXTURES = Path(__file__).parents[2] / "fixtures"
PROMPT = BackendRequest(model="tiny", prompt="hello", sampling=Sampling(max_tokens=4))
CHAT = BackendRequest(model="tiny", messages=(("user", "hi"),), sampling=Sampling(max_tokens=4))


@contextlib.asynccontextmanager
async def vllm_with(handler: Handler, **kw: bool) -> AsyncIterator[VllmBackend]:
    """A vLLM adapter whose server answers every request with ``handler``."""
    async with serve(handler) as url:
        backend = VllmBackend("v", url, ["tiny"], **kw)
        try:
            yield backend
        finally:
            await backend.aclose()


@contextlib.asynccontextmanager
async def tgi_with(handler: Handler) -> AsyncIterator[TgiBackend]:
    """A TGI adapter whose server answers every request with ``handler``."""
    async with serve(handler) as url:
        backend = TgiBackend("v", url, ["m"])
        try:
            yield backend
        finally:
            await backend.aclose()


async def collect(backend: VllmBackend | TgiBackend, req: BackendRequest) -> list[object]:
    return [e async for e in backend.stream(req, 0)]


async def test_recorded_completions_stream() -> None:
    body = (FIXTURES / "completions-stream.sse").read_bytes()
    async with vllm_with(lambda r: sse(body)) as backend:
        events = await collect(backend, PROMPT)
        deltas = [e for e in events if isinstance(e, TextDelta)]
        end = events[-1]
        assert isinstance(end, StreamEnd)
        assert end.finish_reason == "length"
        expected = [
            json.loads(line[6:])["choices"][0]["text"]
            for line in body.decode().splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        ]
        # The mock delivers the body in one read, so the events arrive as one merged delta.
        assert "".join(d.text for d in deltas) == "".join(expected)
        assert sum(d.tokens for d in deltas) == len([t for t in expected if t])


async def test_recorded_chat_stream() -> None:
    body = (FIXTURES / "chat-stream.sse").read_bytes()
    async with vllm_with(lambda r: sse(body)) as backend:
        events = await collect(backend, CHAT)
        assert isinstance(events[-1], StreamEnd)
        assert any(isinstance(e, TextDelta) for e in events)


async def test_payload_sends_priority_only_to_priority_backends() -> None:
    seen: list[dict[str, object]] = []

    async def handler(request: web.BaseRequest) -> web.Response:
        seen.append(await request.json())
        return sse(b'data: {"choices":[{"text":"x","finish_reason":"length"}]}\n\n')

    async with vllm_with(handler) as backend:
        await collect(backend, PROMPT)
    async with vllm_with(handler, priority_scheduling=True) as backend:
        await collect(backend, PROMPT)
    assert "priority" not in seen[0]
    assert seen[1]["priority"] == 0
    assert seen[0]["stream_options"] == {"include_usage": True}
    assert seen[0]["max_tokens"] == 4


def test_a_token_id_prompt_goes_as_the_list_of_ids() -> None:
    backend = VllmBackend("v", "http://127.0.0.1:1", ("m",))
    request = BackendRequest(model="m", prompt_token_ids=(5, 0, 7))
    path, body = backend.payload(request, 0)
    assert path == "/v1/completions" and body["prompt"] == [5, 0, 7]
    assert VllmBackend.token_prompts and not TgiBackend.token_prompts


def test_only_a_default_bound_is_fitted_to_the_context() -> None:
    """Capped at the context on vLLM, left out on TGI at or over it; a caller's own bound and
    a bound below the context go as they are, and so does any bound of an unknown context."""
    vllm = VllmBackend("v", "http://127.0.0.1:1", ("m",))
    tgi = TgiBackend("t", "http://127.0.0.1:1", ("m",))
    vllm.context_lengths = tgi.context_lengths = {"m": 100}

    def sent(max_tokens: int, defaulted: bool, model: str = "m") -> tuple[object, object]:
        sampling = Sampling(max_tokens=max_tokens, max_tokens_defaulted=defaulted)
        request = BackendRequest(model=model, prompt="hi", sampling=sampling)
        tgi_params = tgi.payload(request)[1]["parameters"]
        return vllm.payload(request, 0)[1].get("max_tokens"), tgi_params.get("max_new_tokens")

    assert sent(32768, True) == (100, None)
    assert sent(100, True) == (100, None)
    assert sent(99, True) == (99, 99)
    assert sent(32768, False) == (32768, 32768)
    assert sent(32768, True, model="other") == (32768, 32768)


async def test_context_lengths_are_read_only_as_positive_integers_of_registered_models() -> None:
    cards = [
        {"id": "a", "max_model_len": 4096},
        {"id": "b", "max_model_len": "4096"},
        {"id": "c", "max_model_len": True},
        {"id": "d", "max_model_len": -1},
        {"id": "e"},
        {"id": "unregistered", "max_model_len": 10},
    ]
    async with vllm_with(lambda _: reply(json_body={"object": "list", "data": cards})) as backend:
        backend.models = ("a", "b", "c", "d", "e")
        await backend.verify_models()
        assert backend.context_lengths == {"a": 4096}
    # TGI's comes from /info's max_total_tokens, for every model it is registered for.
    info = {"max_total_tokens": 2048}

    def tgi_server(request: web.BaseRequest) -> web.Response:
        if request.path == "/info":
            return reply(json_body=info)
        return reply(json_body={"object": "list", "data": [{"id": "a"}, {"id": "b"}]})

    async with serve(tgi_server) as url:
        tgi = TgiBackend("t", url, ("a", "b"))
        try:
            await tgi.verify_models()
            assert tgi.context_lengths == {"a": 2048, "b": 2048}
            info["max_total_tokens"] = 1.5
            tgi.context_lengths = {}
            await tgi.verify_models()
            assert tgi.context_lengths == {}
        finally:
            await tgi.aclose()


@pytest.mark.parametrize(
    ("fixture", "status", "code", "needle"),
    [
        ("error-unknown-model.txt", 404, grpc.StatusCode.NOT_FOUND, "does not exist"),
        ("error-too-long.txt", 400, grpc.StatusCode.INVALID_ARGUMENT, "max_model_len"),
    ],
)
async def test_recorded_vllm_errors_keep_the_backend_message(
    fixture: str, status: int, code: grpc.StatusCode, needle: str
) -> None:
    body = (FIXTURES / fixture).read_text().split("\nHTTP")[0].encode()
    async with vllm_with(lambda r: reply(status, body.decode())) as backend:
        with pytest.raises(BackendError) as info:
            await collect(backend, PROMPT)
        assert status_for(info.value)[0] == code
        assert needle in str(info.value)
        assert not info.value.retryable


async def test_server_errors_are_retryable_unavailable() -> None:
    async with vllm_with(lambda r: reply(503, "overloaded")) as backend:
        with pytest.raises(BackendError) as info:
            await collect(backend, PROMPT)
        assert status_for(info.value)[0] == grpc.StatusCode.UNAVAILABLE
        assert info.value.retryable


async def test_connection_refused_is_retryable() -> None:
    backend = VllmBackend("v", unused_url(), ["tiny"])
    with pytest.raises(BackendError) as info:
        await collect(backend, PROMPT)
    await backend.aclose()
    assert info.value.retryable
    assert status_for(info.value)[0] == grpc.StatusCode.UNAVAILABLE


async def test_malformed_event_is_a_clear_error() -> None:
    async with vllm_with(lambda r: sse(b"data: {nope\n\n")) as backend:
        with pytest.raises(BackendError, match="malformed stream event"):
            await collect(backend, PROMPT)


async def test_mid_stream_error_event() -> None:
    body = b'data: {"choices":[{"text":"a"}]}\n\ndata: {"error":{"message":"engine died"}}\n\n'
    async with vllm_with(lambda r: sse(body)) as backend:
        with pytest.raises(BackendError, match="engine died"):
            await collect(backend, PROMPT)


async def test_tgi_generate_stream_without_done() -> None:
    body = (
        b'data:{"index":1,"token":{"id":5,"text":"Hel","logprob":-0.1,"special":false},'
        b'"generated_text":null,"details":null}\n\n'
        b'data:{"index":2,"token":{"id":2,"text":"</s>","logprob":-0.1,"special":true},'
        b'"generated_text":"Hel","details":{"finish_reason":"eos_token","generated_tokens":2,'
        b'"seed":null,"input_length":5}}\n\n'
    )
    async with tgi_with(lambda r: sse(body)) as tgi:
        events = await collect(tgi, PROMPT)
    assert events == [TextDelta("Hel"), StreamEnd("stop", 5, 2)]


async def test_tgi_error_event_on_200() -> None:
    body = b'data: {"error":"Input validation error","error_type":"validation"}\n\n'
    async with tgi_with(lambda r: sse(body)) as tgi:
        with pytest.raises(BackendError, match="Input validation error"):
            await collect(tgi, PROMPT)


async def test_tgi_422_error_body() -> None:
    error = {"error": "too long", "error_type": "validation"}
    async with tgi_with(lambda r: reply(422, json_body=error)) as tgi:
        with pytest.raises(BackendError) as info:
            await collect(tgi, PROMPT)
    assert status_for(info.value)[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "too long" in str(info.value)


async def test_stream_ending_without_a_finish_reason_is_an_error() -> None:
    body = b'data: {"choices":[{"text":"partial"}]}\n\n'
    async with vllm_with(lambda r: sse(body)) as backend:
        with pytest.raises(BackendError, match="before the generation finished") as info:
            await collect(backend, PROMPT)
        assert status_for(info.value)[0] == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    "event",
    [b'{"choices":"abc"}', b'{"choices":[null]}', b'{"choices":[{"text":5}]}',
     b'{"choices":[{"text":"a"}],"usage":{"prompt_tokens":"many"}}'],
)  # fmt: skip
async def test_wrongly_shaped_events_are_clear_errors(event: bytes) -> None:
    async with vllm_with(lambda r: sse(b"data: " + event + b"\n\n")) as backend:
        with pytest.raises(BackendError, match="unexpected stream event") as info:
            await collect(backend, PROMPT)
        assert status_for(info.value)[0] == grpc.StatusCode.INTERNAL


class EndlessBody:
    """A server answer that starts an event and never ends its line; records the hang-up."""

    def __init__(self, first: bytes = b"") -> None:
        self.first = first
        self.sent = 0
        self.closed = asyncio.Event()

    async def __call__(self, request: web.BaseRequest) -> NoReturn:
        answer = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await answer.prepare(request)
        try:
            await answer.write(self.first + b'data: {"choices":[{"text":"')
            while True:
                await answer.write(b"x" * 65536)
                self.sent += 65536
        finally:  # the client closed the stream: writing failed, or the server cancelled us
            self.closed.set()


@pytest.mark.parametrize("kind", ["vllm", "tgi"])
async def test_an_endless_line_is_an_internal_error_naming_backend_and_limit(kind: str) -> None:
    """A backend streaming one line without end: the request fails INTERNAL once the line
    passes the limit (memory stays bounded), and the HTTP stream is closed."""
    body = EndlessBody(b'data: {"choices":[{"text":"a"}]}\n\n' if kind == "vllm" else b"")
    adapter = vllm_with(body) if kind == "vllm" else tgi_with(body)
    events: list[object] = []
    async with adapter as backend:
        with pytest.raises(BackendError) as info:
            async for event in backend.stream(PROMPT, 0):
                events.append(event)
        await asyncio.wait_for(body.closed.wait(), 10)  # the server saw the hang-up
    assert status_for(info.value)[0] == grpc.StatusCode.INTERNAL
    assert not info.value.retryable
    assert "backend v" in str(info.value)
    assert f"{MAX_EVENT_CHARS} characters" in str(info.value)
    # Read up to the limit, not on and on: what the server got rid of is the limit plus what
    # the loopback socket buffers hold (a few MiB), nowhere near an endless stream.
    assert body.sent <= MAX_EVENT_CHARS + 16 * 2**20
    if kind == "vllm":
        assert events == [TextDelta("a")]  # what came before is still relayed


async def test_idle_backend_connections_close_before_the_engines_close_them() -> None:
    # vLLM's server and llama.cpp's close a connection idle for 5 s; a pooled connection
    # reused at that moment fails the request's write and costs it a retry (seen on
    # llama-server under preemption: "Can not write request body"). aiohttp exposes the
    # pool's idle time only as this attribute.
    from fairq_server.backends.base import KEEPALIVE_SECONDS
    from fairq_server.backends.vllm import VllmBackend

    backend = VllmBackend("v", "http://127.0.0.1:1", ["m"])
    try:
        connector = backend.session().connector
        assert connector is not None
        assert connector._keepalive_timeout == KEEPALIVE_SECONDS < 5.0
    finally:
        await backend.aclose()
