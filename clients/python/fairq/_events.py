"""Typed events of a ``Generate`` stream and the completion they add up to.

A stream carries zero or more :class:`Queued`, one :class:`Started` (a second
one when fairq retried the request on another backend before any output), zero
or more :class:`Chunk` and one :class:`Finished`; a failure ends it with a gRPC
status instead of :class:`Finished`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import grpc

from fairq._errors import FairqError
from fairq._json import json_from_struct
from fairq._messages import from_message
from fairq.v1 import scheduler_pb2

__all__ = ["Chunk", "Completion", "Event", "Finished", "Queued", "Started"]


@dataclass(frozen=True, slots=True)
class Queued:
    """The request waits in fairq's queue.

    Attributes:
        position: Estimated 0-based number of requests for the same model ahead of it.

    """

    position: int


@dataclass(frozen=True, slots=True)
class Started:
    """The request was forwarded to a backend.

    Attributes:
        backend_id: The backend serving it.
        queue_seconds: Time spent in fairq's queue.
        tier: The tier it runs in, after the server resolved the default.
        request_id: The caller's id, or the one fairq generated.

    """

    backend_id: str
    queue_seconds: float
    tier: str
    request_id: str


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of generated output.

    Attributes:
        text: The text, to be appended to what came before.
        extra: What the backend sent beside text, only when it did (else
            ``None``): for OpenAI-compatible backends ``{"choices": [...]}``
            with each choice's delta fields other than ``content`` and
            ``role`` (e.g. ``tool_calls``), its ``logprobs`` and ``index``.

    """

    text: str
    # Left out of the hash: a dict is unhashable, and chunks stay hashable.
    extra: Mapping[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True, slots=True)
class Finished:
    """The request completed normally.

    Attributes:
        finish_reason: ``"stop"``, ``"length"`` or the backend's own reason.
        prompt_tokens: Tokens in the prompt, as counted by the backend.
        completion_tokens: Tokens generated.
        queue_seconds: Time in fairq's queue.
        ttft_seconds: From receipt by fairq to the first chunk.
        total_seconds: From receipt by fairq to the end of the stream.

    """

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    queue_seconds: float
    ttft_seconds: float
    total_seconds: float


Event: TypeAlias = Queued | Started | Chunk | Finished


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole ``Generate`` stream collected into one result.

    Attributes:
        text: All chunks joined.
        finish_reason: As in :class:`Finished`.
        backend_id: As in :class:`Started`.
        tier: As in :class:`Started`.
        request_id: As in :class:`Started`.
        prompt_tokens: As in :class:`Finished`.
        completion_tokens: As in :class:`Finished`.
        queue_seconds: As in :class:`Finished`.
        ttft_seconds: As in :class:`Finished`.
        total_seconds: As in :class:`Finished`.
        extras: The :attr:`Chunk.extra` of every chunk that had one, in
            arrival order (e.g. the pieces of a tool call).

    """

    text: str
    finish_reason: str
    backend_id: str
    tier: str
    request_id: str
    prompt_tokens: int
    completion_tokens: int
    queue_seconds: float
    ttft_seconds: float
    total_seconds: float
    extras: tuple[Mapping[str, Any], ...] = ()


# Finished's fields that come from the message's Timings.
_TIMINGS = ("queue_seconds", "ttft_seconds", "total_seconds")


def event_from_proto(response: scheduler_pb2.GenerateResponse) -> Event | None:
    """Convert one ``GenerateResponse`` into its typed event.

    Returns:
        The event, or ``None`` for an event kind this client does not know. The
        proto may gain event kinds (DESIGN.md: fields may be added), and an older
        client should keep streaming past them rather than fail.

    """
    kind: str | None = response.WhichOneof("event")
    if kind == "queued":
        return Queued(position=response.queued.position)
    if kind == "started":
        return from_message(Started, response.started)
    if kind == "chunk":
        chunk = response.chunk
        extra = json_from_struct(chunk.extra) if chunk.HasField("extra") else None
        return Chunk(text=chunk.text, extra=extra)
    if kind == "finished":
        f = response.finished
        return Finished(
            f.finish_reason,
            f.usage.prompt_tokens,
            f.usage.completion_tokens,
            **{name: getattr(f.timings, name) for name in _TIMINGS},
        )
    return None


def events_from_proto(response: scheduler_pb2.GenerateResponse) -> tuple[Event, ...]:
    """Return the event of a ``GenerateResponse``, or none for a kind this client does not know."""
    event = event_from_proto(response)
    return () if event is None else (event,)


class CompletionBuilder:
    """Accumulates the events of one stream into a :class:`Completion`."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._extras: list[Mapping[str, Any]] = []
        self._started: Started | None = None
        self._finished: Finished | None = None

    def add(self, event: Event) -> None:
        """Take the next event of the stream."""
        if isinstance(event, Chunk):
            self._parts.append(event.text)
            if event.extra is not None:
                self._extras.append(event.extra)
        elif isinstance(event, Started):
            self._started = event
        elif isinstance(event, Finished):
            self._finished = event

    def build(self) -> Completion:
        """Return the completion.

        Raises:
            FairqError: (``INTERNAL``) the stream ended without a ``finished``
                event, which the protocol rules out: a failed request ends with
                an error status instead.

        """
        finished = self._finished
        if finished is None:
            raise FairqError(grpc.StatusCode.INTERNAL, "the stream ended without a finished event")
        # A request can finish without a Started event only from a non-conforming
        # server; the fields it would carry are then reported as empty.
        started = self._started or Started(backend_id="", queue_seconds=0.0, tier="", request_id="")
        return Completion(
            text="".join(self._parts),
            backend_id=started.backend_id,
            tier=started.tier,
            request_id=started.request_id,
            extras=tuple(self._extras),
            **dataclasses.asdict(finished),
        )
