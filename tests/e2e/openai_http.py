"""Plain-httpx access to an OpenAI-compatible server (vLLM) for end-to-end tests.

Deliberately independent of fairq's own adapters, so the tests check vLLM's real behaviour
rather than our reading of it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from .flood import SendFn

__all__ = [
    "DONE",
    "StreamError",
    "completions_sender",
    "flood_client",
    "is_idle",
    "iter_sse_data",
    "metric_value",
    "scrape_metrics",
    "wait_for_metrics",
]

#: The payload of the last event of an OpenAI stream.
DONE = "[DONE]"


class StreamError(AssertionError):
    """A stream broke the OpenAI streaming contract (no [DONE], wrong token count, ...)."""


def flood_client() -> httpx.AsyncClient:
    """An ``AsyncClient`` fit for floods: no pool cap and no read timeout.

    httpx's default pool (100 connections) and 5 s read timeout would queue or kill requests
    on the client side, and we want to measure the backend's queue, not ours. Callers bound
    the scenario as a whole instead.
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=None),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


async def iter_sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """Yield the ``data`` payload of each server-sent event, ``[DONE]`` included."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:  # a blank line ends an event
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        # Comments (":") and other fields (event:, id:) carry nothing vLLM uses.
    if data:
        yield "\n".join(data)


def completions_sender(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    *,
    extra_body: Mapping[str, Any] | None = None,
    chat: bool = False,
) -> SendFn:
    """A :data:`flood.SendFn` that streams ``/v1/completions`` with ``ignore_eos``.

    With ``chat``, ``/v1/chat/completions`` instead, the prompt as one user message.

    Each stream is checked: it must end with ``[DONE]`` after a usage chunk reporting exactly
    ``max_tokens`` completion tokens, which is what the flood's token accounting relies on.

    Args:
        client: Preferably from :func:`flood_client`.
        base_url: Server root, e.g. ``http://127.0.0.1:8000``.
        model: Served model name.
        extra_body: Merged into every request body, e.g. ``{"priority": 1}``.
    """

    async def send(user: str, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": user,
            **(extra_body or {}),
        }
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        path = "/v1/chat/completions" if chat else "/v1/completions"
        completion_tokens: int | None = None
        async with client.stream("POST", f"{base_url}{path}", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise StreamError(f"HTTP {response.status_code}: {response.text}")
            async for data in iter_sse_data(response):
                if data == DONE:
                    break
                event = json.loads(data)
                if event.get("usage"):
                    completion_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    delta = choice.get("delta") or {}
                    yield (delta.get("content") if chat else choice.get("text")) or ""
            else:
                raise StreamError("stream ended without [DONE]")
        if completion_tokens != max_tokens:
            raise StreamError(f"asked for {max_tokens} tokens, usage says {completion_tokens}")

    return send


async def scrape_metrics(client: httpx.AsyncClient, base_url: str) -> list[Metric]:
    """GET ``/metrics`` and parse it with prometheus_client's text parser."""
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    return list(text_string_to_metric_families(response.text))


def metric_value(families: list[Metric], sample: str, **labels: str) -> float | None:
    """Sum of the samples named ``sample`` whose labels include ``labels``.

    Summing covers series split by labels we do not ask about (one per engine); ``None``
    means no such sample at all, which is different from a zero.
    """
    values = [
        s.value
        for family in families
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(values) if values else None


async def wait_for_metrics(
    client: httpx.AsyncClient,
    base_url: str,
    condition: Callable[[list[Metric]], bool],
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
) -> list[Metric]:
    """Scrape ``/metrics`` until ``condition`` holds; return that scrape.

    Raises:
        TimeoutError: Still false after ``timeout_s``; the message names the last values of
            the scheduler gauges to make the failure readable.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        families = await scrape_metrics(client, base_url)
        if condition(families):
            return families
        if time.monotonic() > deadline:
            running = metric_value(families, "vllm:num_requests_running")
            waiting = metric_value(families, "vllm:num_requests_waiting")
            raise TimeoutError(
                f"metrics condition still false after {timeout_s} s "
                f"(running={running}, waiting={waiting})"
            )
        await asyncio.sleep(interval_s)


def is_idle(families: list[Metric]) -> bool:
    """No request running or waiting in the backend."""
    return (
        metric_value(families, "vllm:num_requests_running") == 0
        and metric_value(families, "vllm:num_requests_waiting") == 0
    )
