"""Targets a workload can be sent to: a backend directly (the FIFO baseline) or fairq."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import grpc
import httpx

from fairq import AsyncClient, Chunk
from fairq_bench.workload import RequestSpec, SendFn
from fairq_server.backends.sse import aiter_sse_batches

__all__ = [
    "aiohttp_session",
    "direct_sender",
    "fairq_sender",
    "free_port",
    "http_client",
    "keyed_sender",
    "openai_sender",
]


def free_port() -> int:
    """A free loopback port for a benchmark child's second listener (tests bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_client() -> httpx.AsyncClient:
    """An HTTP client that never queues on its own side (no pool cap, no read timeout)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(30.0, read=None),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


def direct_sender(client: httpx.AsyncClient, base_url: str, model: str, kind: str) -> SendFn:
    """Send straight to a vLLM (``/v1/completions``) or TGI (``/generate_stream``) backend."""

    async def send(spec: RequestSpec) -> AsyncIterator[str]:
        if kind == "tgi":
            path = "/generate_stream"
            body: dict[str, object] = {
                "inputs": spec.prompt,
                "parameters": {"max_new_tokens": spec.max_tokens},
            }
        else:
            path = "/v1/completions"
            body = {
                "model": model,
                "prompt": spec.prompt,
                "max_tokens": spec.max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        async with client.stream("POST", base_url + path, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            async for batch in aiter_sse_batches(resp.aiter_text()):
                for data in batch:
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if event.get("error"):
                        raise RuntimeError(str(event["error"]))
                    token = event.get("token")
                    if isinstance(token, dict):
                        if not token.get("special"):
                            yield str(token.get("text", ""))
                        continue
                    for choice in event.get("choices") or ():
                        if choice.get("text"):
                            yield str(choice["text"])

    return send


def openai_sender(
    session: aiohttp.ClientSession, base_url: str, model: str, *, with_user: bool = False
) -> SendFn:
    """Stream OpenAI ``/v1/completions`` from ``base_url`` (a backend, or fairq's HTTP door).

    aiohttp's client (C parser) keeps the client's own cost per event small and the same
    for the backend and the door, so the difference between them is fairq's. With
    ``with_user`` the body names the request's user (fairq's open mode reads it).
    """

    async def send(spec: RequestSpec) -> AsyncIterator[str]:
        body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.max_tokens,
                "ignore_eos": True, "stream": True}  # fmt: skip
        if with_user:
            body["user"] = spec.user
        headers = {"x-fairq-tier": spec.tier} if spec.tier and with_user else {}
        async with session.post(f"{base_url}/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
            async for batch in aiter_sse_batches(_text(resp.content)):
                for data in batch:
                    if data == "[DONE]":
                        continue
                    event = json.loads(data)
                    if event.get("error"):
                        raise RuntimeError(str(event["error"]))
                    for choice in event.get("choices") or ():
                        if choice.get("text"):
                            yield str(choice["text"])

    return send


async def _text(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    async for chunk in content.iter_any():
        yield chunk.decode()


def aiohttp_session() -> aiohttp.ClientSession:
    """A client session that never queues on its own side (no pool cap, no timeout)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )


def fairq_sender(channel: grpc.aio.Channel, model: str) -> SendFn:
    """Send through fairq as the request's user (open mode: ``x-fairq-user``).

    One client per user, all on the one shared channel.
    """
    clients: dict[str, AsyncClient] = {}

    async def send(spec: RequestSpec) -> AsyncIterator[str]:
        client = clients.get(spec.user)
        if client is None:
            client = clients[spec.user] = AsyncClient("", user=spec.user, channel=channel)
        events = client.generate(
            model, spec.prompt, max_tokens=spec.max_tokens, ignore_eos=True, tier=spec.tier
        )
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Chunk):
                    yield event.text

    return send


def keyed_sender(channel: grpc.aio.Channel, model: str, api_keys: dict[str, str]) -> SendFn:
    """Send through fairq with each user's API key (so configured weights and tiers apply).

    Args:
        channel: one shared channel.
        model: the model name.
        api_keys: user name to API key; every request's user must have one.

    """
    clients = {
        user: AsyncClient("", api_key=key, channel=channel) for user, key in api_keys.items()
    }

    async def send(spec: RequestSpec) -> AsyncIterator[str]:
        events = clients[spec.user].generate(
            model, spec.prompt, max_tokens=spec.max_tokens, ignore_eos=True, tier=spec.tier
        )
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Chunk):
                    yield event.text

    return send
