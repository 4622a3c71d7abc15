"""Typed events of a ``Generate`` stream and the completion they add up to.

A stream carries zero or more :class:`Queued`, one :class:`Started` (a second
one when fairq retried the request on another backend before any output), zero
or more :class:`Chunk` and one :class:`Finished`; a failure ends it with a gRPC
status instead of :class:`Finished`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import grpc

from fairq._errors import FairqError
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
    """A piece of generated text.

    Attributes:
        text: The text, to be appended to what came before.

    """

    text: str


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
        s = response.started
        return Started(
            backend_id=s.backend_id,
            queue_seconds=s.queue_seconds,
            tier=s.tier,
            request_id=s.request_id,
        )
    if kind == "chunk":
        return Chunk(text=response.chunk.text)
    if kind == "finished":
        f = response.finished
        return Finished(
            finish_reason=f.finish_reason,
            prompt_tokens=f.usage.prompt_tokens,
            completion_tokens=f.usage.completion_tokens,
            queue_seconds=f.timings.queue_seconds,
            ttft_seconds=f.timings.ttft_seconds,
            total_seconds=f.timings.total_seconds,
        )
    return None


class CompletionBuilder:
    """Accumulates the events of one stream into a :class:`Completion`."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._started: Started | None = None
        self._finished: Finished | None = None

    def add(self, event: Event) -> None:
        """Take the next event of the stream."""
        if isinstance(event, Chunk):
            self._parts.append(event.text)
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
            finish_reason=finished.finish_reason,
            backend_id=started.backend_id,
            tier=started.tier,
            request_id=started.request_id,
            prompt_tokens=finished.prompt_tokens,
            completion_tokens=finished.completion_tokens,
            queue_seconds=finished.queue_seconds,
            ttft_seconds=finished.ttft_seconds,
            total_seconds=finished.total_seconds,
        )
