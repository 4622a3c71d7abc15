"""llama.cpp's own token count keeps a continuation exact.

llama-server sends no chunk for a token that ends inside a character (its bytes wait for the
character's next token), so one chunk is not one token. With preemption on, fairq asks it for
``timings_per_token`` and counts by ``timings.predicted_n``; a continuation then asks for
exactly the tokens that remain, and the caller never sees the timings fairq asked for.

The stand-in below streams what llama-server streams for such an output (chunks shaped as its
``/v1/completions`` writes them, a token without a chunk in the middle); llama-server itself
is not built in CI (see ``tests/e2e/llamacpp_process.py``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web

from fairq_server.backends.continuation import Progress
from fairq_server.backends.openai import OpenAIBackend
from fairq_server.backends.passthrough import RawDelta
from fairq_server.backends.request import BackendRequest, Sampling, TextDelta
from fairq_server.config.schema import BackendConfig

# Four tokens generated, three chunks: the second token's bytes came with the third's.
_CHUNKS = [("He", 1), ("llé", 3), ("!", 4)]


def _chunk(text: str, predicted: int, timings: bool) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}],
        "model": "llama", "object": "text_completion", "id": "cmpl-1", "created": 1,
    }  # fmt: skip
    if timings:
        obj["timings"] = {"predicted_n": predicted, "predicted_ms": 1.0}
    return obj


@pytest.fixture
async def llama() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in for llama-server's streamed completions; yields its URL and the bodies."""
    bodies: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        timings = bool(body.get("timings_per_token"))
        for text, predicted in _CHUNKS:
            data = json.dumps(_chunk(text, predicted, timings))
            await resp.write(f"data: {data}\n\n".encode())
        end = _chunk("", 4, True)
        end["choices"][0]["finish_reason"] = "length"
        await resp.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", bodies
    await runner.cleanup()


def _backend(url: str, preempt: bool) -> OpenAIBackend:
    cfg = BackendConfig(
        "llama", "openai", url, ("llama",), metrics_preset="llamacpp", max_in_flight=2,
        preempt=preempt,
    )  # fmt: skip
    return OpenAIBackend.from_config(cfg, timeout=5)


def _request(relay: bool) -> BackendRequest:
    return BackendRequest(
        "llama", prompt="Say", sampling=Sampling(max_tokens=10), relay_chunks=relay
    )


async def _progress(backend: OpenAIBackend, request: BackendRequest) -> tuple[Progress, str]:
    progress, relayed = Progress(), ""
    try:
        async for event in backend.stream(request, 0):
            if isinstance(event, RawDelta):
                relayed += event.text
                progress.record(event)
            elif isinstance(event, TextDelta):
                progress.record(event)
    finally:
        await backend.aclose()
    return progress, relayed


@pytest.mark.parametrize("relay", [False, True], ids=["grpc", "http"])
async def test_a_continuation_asks_for_exactly_what_remains(
    llama: tuple[str, list[dict[str, Any]]], relay: bool
) -> None:
    url, bodies = llama
    backend = _backend(url, preempt=True)
    progress, relayed = await _progress(backend, _request(relay))
    assert bodies[0]["timings_per_token"] is True
    assert progress.text == "Hellé!"
    assert progress.tokens == 4  # counting chunks would say 3
    resume = progress.resume()
    assert resume.tokens == 4
    _, body = backend.payload(replace(_request(relay), resume=resume), 0)
    assert body["max_tokens"] == 6  # 10 asked, 4 generated
    assert body["prompt"] == "SayHellé!"
    if relay:
        assert relayed and "timings" not in relayed  # fairq's own question, not the caller's


async def test_without_preemption_nothing_is_asked_and_a_callers_timings_pass(
    llama: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = llama
    _, relayed = await _progress(_backend(url, preempt=False), _request(True))
    assert "timings_per_token" not in bodies[0]
    asked = BackendRequest(
        "llama", prompt="Say", sampling=Sampling(max_tokens=10), relay_chunks=True,
        extra={"timings_per_token": True},
    )  # fmt: skip
    _, relayed = await _progress(_backend(url, preempt=True), asked)
    assert '"predicted_n":1' in relayed.replace(" ", "")  # the caller asked: relayed as sent
