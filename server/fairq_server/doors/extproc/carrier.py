"""A request whose bytes Envoy carries: the attempt's stream, as the launcher reads it.

The dispatcher picks the backend and holds the slot as for any request; where the launcher
would open the backend stream it reads :meth:`EnvoyCarrier.stream` instead
(:class:`~fairq_server.scheduling.ticket.Carrier`). Opening it is the dispatch: the door is told
the backend (:attr:`EnvoyCarrier.dispatched`) and answers Envoy with the endpoint. Envoy's Lua
filter says when the response's first bytes arrive (:meth:`EnvoyCarrier.first_byte`): the
request's first token, for the gate, which counts it as waiting in the engine until then. Then
the stream waits, with no work per token, for the end Envoy reports, once per request:

- the access log entry (:meth:`EnvoyCarrier.report`) with the backend's usage block, as the
  Lua filter found it: the stream ends with those counts, which settle fairness, quotas,
  budgets and the ledger as any backend stream's end does;
- Envoy closing the ext_proc stream (:meth:`EnvoyCarrier.closed`), which it does when the
  HTTP stream ends (finished, failed, or the client gone): the entry is waited for a moment
  more (``grace``), then the stream ends on an estimate;
- at the latest ``max_seconds`` after dispatch (a lost stream).

A client gone while its request is queued is Envoy resetting the ext_proc stream: the door
cancels the ticket like the HTTP door does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from fairq_server.backends.request import StreamEnd, StreamEvent, TextDelta
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.lookahead import LOOKAHEAD_TOKENS
from fairq_server.scheduling.ticket import Ticket

__all__ = ["BYTES_PER_TOKEN", "EnvoyCarrier", "Usage"]

#: Without a usage block, completion tokens are estimated from the body's bytes: an SSE chunk
#: of one token from vLLM's chat API is 150-250 bytes.
BYTES_PER_TOKEN = 200


@dataclass(frozen=True)
class Usage:
    """What Envoy's access log entry says of a request's end.

    Attributes:
        prompt_tokens, completion_tokens: the backend's usage block (None: none was seen).
        status: the HTTP status sent to the client (0: none, the client left first).
        body_bytes: response body bytes sent to the client.
        client_left: the client closed its connection before the end.

    """

    prompt_tokens: int | None
    completion_tokens: int | None
    status: int
    body_bytes: int
    client_left: bool


class EnvoyCarrier:
    """One request carried by Envoy (see the module's description)."""

    def __init__(self, grace: float, max_seconds: float) -> None:
        loop = asyncio.get_running_loop()
        #: The backend the request was dispatched to (set when the attempt's stream opens).
        self.dispatched: asyncio.Future[BackendState] = loop.create_future()
        self._grace = grace
        self._max_seconds = max_seconds
        self._usage: Usage | None = None
        self._reported = asyncio.Event()
        self._closed = asyncio.Event()
        self._first = asyncio.Event()

    def first_byte(self) -> None:
        """Note that the response's first bytes arrived (the request runs on its engine)."""
        self._first.set()

    def report(self, usage: Usage) -> None:
        """Take the access log entry of the request's end."""
        self._usage = usage
        self._reported.set()

    def closed(self) -> None:
        """Note that Envoy closed the request's ext_proc stream (its HTTP stream ended)."""
        self._closed.set()

    def stream(self, ticket: Ticket) -> AsyncGenerator[StreamEvent]:
        """See :meth:`fairq_server.scheduling.ticket.Carrier.stream`.

        The door is told at once, as the launcher starts the attempt (not when its reading
        task first runs): the answer to Envoy is the request's way to its backend.
        """
        backend = ticket.backend
        assert backend is not None
        if not self.dispatched.done():
            self.dispatched.set_result(backend)
        return self._events(ticket)

    async def _events(self, ticket: Ticket) -> AsyncGenerator[StreamEvent]:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._max_seconds):
                if await self._until(self._first):
                    # Its first token, as far as the gate is concerned: no longer waiting.
                    yield TextDelta("", tokens=0)
                    ahead = self._ahead(ticket)
                    if ahead is None:
                        await self._until(None)
                    elif await self._until(None, within=ahead[1]):
                        # Predicted within the lookahead of its end: its slot may be filled
                        # ahead, and the tokens so far are charged (settled at the end).
                        yield TextDelta("", tokens=ahead[0])
                        await self._until(None)
        yield self._stream_end(ticket)

    @staticmethod
    def _ahead(ticket: Ticket) -> tuple[int, float] | None:
        """Tokens before the lookahead and the seconds they take at the backend's pace.

        None: no output bound, or the backend's time per output token is not known. Envoy
        sends no token counts while a stream runs; the engine's pace predicts them, so a
        request near its bound frees its slot a moment ahead as one fairq relays does
        (:mod:`~fairq_server.scheduling.lookahead`; without it, closed-loop teams measured
        0.9 of their owed share against 0.97).
        """
        backend = ticket.backend
        tokens = ticket.max_tokens - LOOKAHEAD_TOKENS
        tpot = backend.tpot_seconds if backend is not None else None
        if tokens <= 0 or not tpot:
            return None
        return tokens, tokens * tpot

    async def _until(self, first: asyncio.Event | None, within: float | None = None) -> bool:
        """Wait for ``first`` (True), or the end (False): reported, or closed and a grace.

        With ``within``: True if that long passed first (the end has not come).
        """
        waits = {asyncio.ensure_future(self._reported.wait())}
        closed = asyncio.ensure_future(self._closed.wait())
        waits.add(closed)
        hit = None if first is None else asyncio.ensure_future(first.wait())
        if hit is not None:
            waits.add(hit)
        try:
            await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
            if (hit is not None and hit.done()) or not any(w.done() for w in waits):
                return True
            if not self._reported.is_set():
                await asyncio.wait_for(self._reported.wait(), self._grace)
        except TimeoutError:
            pass
        finally:
            for wait in waits:
                wait.cancel()
        return False

    def _stream_end(self, ticket: Ticket) -> StreamEnd:
        usage = self._usage
        if usage is None:
            return StreamEnd("unreported", ticket.prompt_tokens, 0)
        if usage.prompt_tokens is not None and usage.completion_tokens is not None:
            return StreamEnd("stop", usage.prompt_tokens, usage.completion_tokens)
        if usage.status >= 400:  # the backend refused it (or failed before any text)
            return StreamEnd("error", ticket.prompt_tokens, 0)
        # No usage block (the client left, or the backend did not say): an estimate.
        reason = "cancelled" if usage.client_left else "unreported"
        return StreamEnd(reason, ticket.prompt_tokens, usage.body_bytes // BYTES_PER_TOKEN)
