"""Building fairq requests and call metadata from the clients' keyword arguments.

Shared by the async and the sync client so that both send identical messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

from fairq.v1 import admin_pb2, scheduler_pb2

__all__ = ["ChatMessages"]

# One sequence whose items may mix both forms: a superset of "all pairs" or
# "all mappings", and what a literal like [("system", s), {"role": ...}] needs.
ChatMessages: TypeAlias = Sequence[tuple[str, str] | Mapping[str, str]]
"""Chat messages as ``(role, content)`` pairs or ``{"role": ..., "content": ...}`` mappings."""

Metadata: TypeAlias = tuple[tuple[str, str], ...]


def build_metadata(api_key: str | None, user: str | None) -> Metadata:
    """Return the identity metadata sent with every call.

    Args:
        api_key: Sent as ``authorization: Bearer <api_key>`` when given.
        user: Sent as ``x-fairq-user`` when given (honoured by servers with no
            API keys configured, i.e. local development).

    """
    metadata: list[tuple[str, str]] = []
    if api_key is not None:
        metadata.append(("authorization", f"Bearer {api_key}"))
    if user is not None:
        metadata.append(("x-fairq-user", user))
    return tuple(metadata)


def build_generate_request(
    model: str,
    prompt: str | None,
    *,
    messages: ChatMessages | None,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    stop: Sequence[str],
    seed: int | None,
    ignore_eos: bool,
    tier: str,
    request_id: str,
) -> scheduler_pb2.GenerateRequest:
    """Build a ``GenerateRequest``; see ``AsyncClient.generate`` for the arguments.

    Only what the message cannot express is checked here (exactly one input,
    well-formed messages); limits are the server's to enforce, so that every
    client gets the same errors.

    Raises:
        ValueError: Neither or both of ``prompt`` and ``messages`` were given,
            or a message mapping lacks ``role`` or ``content``.
        TypeError: ``stop`` or ``messages`` is a plain string.

    """
    if (prompt is None) == (messages is None):
        raise ValueError("pass exactly one of prompt or messages")
    # A str is a Sequence[str] to the type checker, so this mistake would
    # otherwise silently send one stop string per character.
    if isinstance(stop, str):
        raise TypeError("stop must be a sequence of strings, not a str")

    sampling = scheduler_pb2.SamplingParams(stop=list(stop), ignore_eos=ignore_eos)
    # Unset optional fields mean "the backend's default"; only set what was given.
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    if temperature is not None:
        sampling.temperature = temperature
    if top_p is not None:
        sampling.top_p = top_p
    if seed is not None:
        sampling.seed = seed

    request = scheduler_pb2.GenerateRequest(
        model=model, sampling=sampling, tier=tier, request_id=request_id
    )
    if prompt is not None:
        request.prompt = prompt
    elif messages is not None:
        # SetInParent selects the oneof even for an empty list, so the server
        # reports the empty conversation instead of a missing input.
        request.messages.SetInParent()
        request.messages.messages.extend(_chat_messages(messages))
    return request


def build_snapshot_request(top_users: int) -> admin_pb2.GetQueueSnapshotRequest:
    """Build a queue-snapshot request.

    Raises:
        ValueError: ``top_users`` is negative.

    """
    if top_users < 0:
        raise ValueError("top_users must be 0 or more")
    return admin_pb2.GetQueueSnapshotRequest(top_users=top_users)


def _chat_messages(messages: ChatMessages) -> list[scheduler_pb2.ChatMessage]:
    if isinstance(messages, str):
        raise TypeError("messages must be a sequence of (role, content) pairs or mappings")
    converted: list[scheduler_pb2.ChatMessage] = []
    for index, message in enumerate(messages):
        if isinstance(message, Mapping):
            try:
                role, content = message["role"], message["content"]
            except KeyError as exc:
                raise ValueError(f"messages[{index}] has no {exc.args[0]!r} key") from exc
        else:
            role, content = message
        converted.append(scheduler_pb2.ChatMessage(role=role, content=content))
    return converted
