"""Checking a ``GenerateRequest`` and turning it into a backend-neutral request."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence

from google.protobuf import json_format

from fairq.v1 import scheduler_pb2
from fairq_server.backends.request import BackendRequest, Sampling
from fairq_server.config.schema import RequestBounds
from fairq_server.doors.estimate import CHARS_PER_TOKEN
from fairq_server.doors.passthrough import check_extra, output_bound
from fairq_server.errors import InvalidRequestError
from fairq_server.names import check_model, check_request_id

__all__ = ["GRPC_RESERVED", "models_hint", "to_backend_request"]

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
#: Keys of ``GenerateRequest.extra`` that fairq sets itself (or checks in ``sampling``).
GRPC_RESERVED = frozenset(
    {
        "model", "prompt", "messages", "stream", "priority", "request_id",
        "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
        "ignore_eos",
    }
)  # fmt: skip


def models_hint(models: Iterable[str], max_chars: int = 1000) -> str:
    """Return ``"; models: a, b (and 3 more)"`` naming at most ``max_chars`` of ``models``.

    A status message travels in a trailer bounded by the client's metadata limit (8 KiB by
    default), so the list is cut rather than failing every unknown-model call.
    """
    names = sorted(models)
    shown: list[str] = []
    used = 0
    for name in names:
        if used + len(name) + 2 > max_chars:
            break
        shown.append(name)
        used += len(name) + 2
    rest = len(names) - len(shown)
    listed = ", ".join(shown) or "none"
    return f"; models: {listed}" + (f" (and {rest} more)" if rest else "")


def to_backend_request(req: scheduler_pb2.GenerateRequest, limits: RequestBounds) -> BackendRequest:
    """Validate ``req`` and return the backend-neutral request.

    Raises:
        InvalidRequestError: with a message naming the offending field.

    """
    try:
        check_model(req.model, "model")
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    which = req.WhichOneof("input")
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    token_ids: tuple[int, ...] | None = None
    if which == "prompt":
        if not req.prompt.strip():
            raise InvalidRequestError("prompt is empty")
        if len(req.prompt) > limits.max_prompt_chars:
            raise InvalidRequestError(
                f"prompt has {len(req.prompt)} characters; the limit is {limits.max_prompt_chars}"
            )
        prompt = req.prompt
    elif which == "messages":
        msgs = req.messages.messages
        if not msgs:
            raise InvalidRequestError("messages is empty")
        if len(msgs) > limits.max_messages:
            raise InvalidRequestError(f"{len(msgs)} messages; the limit is {limits.max_messages}")
        for i, m in enumerate(msgs):
            if m.role not in _ROLES:
                raise InvalidRequestError(
                    f"messages[{i}].role '{m.role[:32]}' is not one of {', '.join(sorted(_ROLES))}"
                )
        total = sum(len(m.content) for m in msgs)
        if total > limits.max_prompt_chars:
            raise InvalidRequestError(
                f"messages have {total} characters; the limit is {limits.max_prompt_chars}"
            )
        messages = tuple((m.role, m.content) for m in msgs)
    elif which == "prompt_token_ids":
        token_ids = _token_ids(req.prompt_token_ids.ids, limits)
    else:
        raise InvalidRequestError("one of prompt, messages or prompt_token_ids is required")
    if req.request_id:
        try:
            check_request_id(req.request_id)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
    extra = (
        check_extra(
            json_format.MessageToDict(req.extra), limits, field="extra", reserved=GRPC_RESERVED
        )
        if req.HasField("extra")
        else {}
    )
    return BackendRequest(
        model=req.model,
        prompt=prompt,
        messages=messages,
        sampling=_sampling(req.sampling, limits),
        request_id=req.request_id or uuid.uuid4().hex,
        extra=extra,
        prompt_token_ids=token_ids,
    )


def _token_ids(ids: Sequence[int], limits: RequestBounds) -> tuple[int, ...]:
    """Check a token-id prompt as the HTTP door does (a token counts as 4 characters)."""
    if not ids:
        raise InvalidRequestError("prompt_token_ids is empty")
    limit = limits.max_prompt_chars // CHARS_PER_TOKEN
    if len(ids) > limit:
        raise InvalidRequestError(
            f"prompt_token_ids has {len(ids)} ids; the limit is {limit} "
            f"(max_prompt_chars / {CHARS_PER_TOKEN})"
        )
    if max(ids) >= 2**31:
        raise InvalidRequestError("prompt_token_ids: every id must be below 2^31")
    return tuple(ids)


def _sampling(s: scheduler_pb2.SamplingParams, limits: RequestBounds) -> Sampling:
    max_tokens = s.max_tokens if s.HasField("max_tokens") else None
    if max_tokens is not None and not 1 <= max_tokens <= limits.max_tokens:
        raise InvalidRequestError(
            f"sampling.max_tokens must be between 1 and {limits.max_tokens}, got {max_tokens}"
        )
    temperature = s.temperature if s.HasField("temperature") else None
    if temperature is not None and not (math.isfinite(temperature) and 0 <= temperature <= 2):
        raise InvalidRequestError(f"sampling.temperature must be in [0, 2], got {temperature}")
    top_p = s.top_p if s.HasField("top_p") else None
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise InvalidRequestError(f"sampling.top_p must be in (0, 1], got {top_p}")
    if len(s.stop) > limits.max_stop_strings:
        raise InvalidRequestError(
            f"sampling.stop has {len(s.stop)} strings; the limit is {limits.max_stop_strings}"
        )
    if any(not x or len(x) > limits.max_stop_chars for x in s.stop):
        raise InvalidRequestError(
            f"sampling.stop strings must be 1-{limits.max_stop_chars} characters"
        )
    return Sampling(
        max_tokens=output_bound(limits, max_tokens),
        max_tokens_defaulted=max_tokens is None,
        # float32 on the wire: round so 0.7 reaches the backend as 0.7, not 0.699999988.
        temperature=round(temperature, 6) if temperature is not None else None,
        top_p=round(top_p, 6) if top_p is not None else None,
        stop=tuple(s.stop),
        seed=s.seed if s.HasField("seed") else None,
        ignore_eos=s.ignore_eos,
    )
