"""Pieces of fairq requests: call metadata, chat messages, sampling parameters.

``fairq._calls`` assembles them into the calls both clients send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

from fairq.v1 import scheduler_pb2

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


def build_sampling(
    stop: Sequence[str], ignore_eos: bool, optional: Mapping[str, float | int | None]
) -> scheduler_pb2.SamplingParams:
    """Build the sampling parameters; ``optional`` fields that are ``None`` stay unset.

    Raises:
        TypeError: ``stop`` is a plain string.

    """
    # A str is a Sequence[str] to the type checker, so this mistake would
    # otherwise silently send one stop string per character.
    if isinstance(stop, str):
        raise TypeError("stop must be a sequence of strings, not a str")
    sampling = scheduler_pb2.SamplingParams(stop=list(stop), ignore_eos=ignore_eos)
    # Unset optional fields mean "the backend's default"; only set what was given.
    for name, value in optional.items():
        if value is not None:
            setattr(sampling, name, value)
    return sampling


def set_input(
    request: scheduler_pb2.GenerateRequest,
    prompt: str | Sequence[int] | None,
    messages: ChatMessages | None,
) -> None:
    """Set the request's input: the prompt (text or token ids), or the chat messages.

    Raises:
        ValueError: Neither or both were given, or a message mapping lacks
            ``role`` or ``content``.
        TypeError: ``messages`` is a plain string.

    """
    if (prompt is None) == (messages is None):
        raise ValueError("pass exactly one of prompt or messages")
    if isinstance(prompt, str):
        request.prompt = prompt
    elif prompt is not None:
        request.prompt_token_ids.SetInParent()
        request.prompt_token_ids.ids.extend(prompt)
    elif messages is not None:
        # SetInParent selects the oneof even for an empty list, so the server
        # reports the empty conversation instead of a missing input.
        request.messages.SetInParent()
        request.messages.messages.extend(_chat_messages(messages))


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
