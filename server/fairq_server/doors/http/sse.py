"""Server-sent event framing towards HTTP callers.

Backend chunks go out as ``data:`` events exactly as received (one ``data:`` line per
payload: a JSON chunk never contains a raw newline). Comments (lines starting with ``:``)
carry fairq's queue position; OpenAI SDKs and browsers skip them. An error after the stream
has begun cannot change the HTTP status any more, so it is sent as an event holding an
OpenAI error object, which the ``openai`` SDKs raise as ``APIError``; no ``[DONE]`` follows.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DONE", "SSE_HEADERS", "comment", "data_events", "error_event"]

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    # Proxies (nginx) must not buffer the stream.
    "x-accel-buffering": "no",
}


def data_events(payloads: Iterable[str]) -> bytes:
    """Frame JSON payloads as consecutive ``data:`` events."""
    return "".join(f"data: {p}\n\n" for p in payloads).encode()


def comment(text: str) -> bytes:
    """Frame ``text`` (one line) as an SSE comment."""
    return f": {text.replace(chr(10), ' ').replace(chr(13), ' ')}\n\n".encode()


def error_event(body: bytes) -> bytes:
    """Frame an OpenAI error body as the stream's last event."""
    return b"data: " + body + b"\n\n"
