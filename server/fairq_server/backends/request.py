"""What fairq asks of a backend and what it reads back, independent of the backend's API.

A :class:`BackendRequest` goes in; :class:`TextDelta` and :class:`StreamEnd` events come out of
a generation stream; a :class:`MetricsSample` comes out of a ``/metrics`` scrape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BackendRequest",
    "MetricsSample",
    "Resume",
    "Sampling",
    "StreamEnd",
    "StreamEvent",
    "TextDelta",
]


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; None means "the backend's default".

    ``max_tokens_defaulted`` says the caller gave no output bound and ``max_tokens`` is
    fairq's default (``limits.default_max_tokens`` or ``limits.max_tokens``): a backend that
    knows the model's context length sends at most that (see
    :func:`~fairq_server.backends.openai_wire.openai_body`).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    max_tokens_defaulted: bool = False


@dataclass(frozen=True)
class Resume:
    """What earlier attempts of a preempted request generated: the continuation asks for the rest.

    Attributes:
        text: the generated text so far (what the caller has already been sent).
        tokens: how many tokens that was.
        token_ids: prompt and generated token ids, where the engine returned them (vLLM): the
            continuation's prompt is then token-exact. None: continue from ``text``.
        chunk_id: the ``id`` of the first attempt's OpenAI chunks (the HTTP door keeps it).
        created: their ``created``.

    """

    text: str
    tokens: int
    token_ids: tuple[int, ...] | None = None
    chunk_id: str | None = None
    created: int | None = None


@dataclass(frozen=True)
class BackendRequest:
    """One generation request, independent of the backend's API.

    Attributes:
        model: the model name.
        prompt: the prompt (completions), or None for chat.
        messages: ``(role, text)`` of each chat message: what fairq estimates and hashes.
        sampling: the parameters fairq validates itself.
        request_id: the caller's or a generated id.
        extra: parameters fairq passes through without interpreting them (tools,
            ``response_format``, ``logprobs``, ``n``, penalties, engine options), merged
            into the backend's JSON body under fairq's own fields.
        raw_messages: the chat messages exactly as the caller sent them (content parts,
            ``tool_calls``, ``tool_call_id``); sent instead of ``messages`` when set.
        relay_chunks: stream the backend's OpenAI chunks as they came, framed as SSE, in
            each delta's text (the HTTP door), instead of the generated text (gRPC).
        relay_usage: with ``relay_chunks``, keep the final usage chunk (the caller asked
            for it too).
        resume: set on the continuation of a preempted request (see
            :mod:`~fairq_server.backends.continuation`).
        prompt_token_ids: the prompt as token ids (completions), sent instead of ``prompt``
            to engines that take them (:attr:`~fairq_server.backends.base.Backend.token_prompts`).

    """

    model: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    request_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    raw_messages: tuple[Mapping[str, Any], ...] | None = None
    relay_chunks: bool = False
    relay_usage: bool = False
    resume: Resume | None = None
    prompt_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TextDelta:
    """Generated output; ``tokens`` is how many tokens it carries as far as the API says.

    An event with ``tokens == 0`` (an opening role-only chunk) is relayed but is not the
    first token. ``extra`` holds what the backend sent beside text (tool calls, logprobs),
    one object per choice event, in order. ``token_ids`` are the generated token ids and
    ``prompt_token_ids`` the prompt's, where the engine returned them.
    """

    text: str
    tokens: int = 1
    extra: tuple[Mapping[str, Any], ...] = ()
    token_ids: tuple[int, ...] = ()
    prompt_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class StreamEnd:
    """The stream finished normally."""

    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


StreamEvent = TextDelta | StreamEnd


@dataclass(frozen=True)
class MetricsSample:
    """The values fairq reads from a backend's ``/metrics`` (cumulative where counters).

    Attributes:
        waiting: requests in the backend's queue.
        running: requests being processed.
        kv_usage: KV-cache usage 0-1, if reported.
        tpot_sum: cumulative seconds of the time-per-output-token histogram.
        tpot_count: cumulative count of that histogram.
        missing: ``(figure, sample name)`` of each figure (``running``, ``kv_usage``,
            ``tpot``) the adapter could not read: the name it looked for and did not find,
            or ``""`` when the backend's mapping names none.

    """

    waiting: float
    running: float
    kv_usage: float | None = None
    tpot_sum: float = 0.0
    tpot_count: float = 0.0
    missing: tuple[tuple[str, str], ...] = ()
