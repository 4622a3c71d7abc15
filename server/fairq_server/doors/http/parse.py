"""Reading an OpenAI request body into fairq's backend-neutral request.

fairq interprets only what it schedules by or must bound: ``model``, the input (``messages``
or ``prompt``), ``stream`` and ``stream_options.include_usage``, the output bound
(``max_tokens`` / ``max_completion_tokens``), the sampling fields it checks for the gRPC door
too (``temperature``, ``top_p``, ``stop``, ``seed``, ``ignore_eos``), and ``user`` (the
identity in open mode, passed on as well). ``priority`` is refused: the tier decides it.
Everything else (``tools``, ``response_format``, ``logprobs``, penalties, engine options) is
passed through unchanged, bounded in size and depth. Chat messages are passed on exactly as
sent (content parts, tool calls); fairq reads only their role and text. A completions
``prompt`` may be token ids, or a list of prompts, and ``n`` asks for several choices: each
prompt and each choice becomes its own request (:attr:`ParsedRequest.batch`, answered by
:mod:`fairq_server.doors.http.fanout`), so ``n`` choices hold ``n`` backend slots, as vLLM
runs them.

Defaults are OpenAI's: a completions request without ``max_tokens`` gets 16 tokens; a chat
request without one, everything the context leaves (bounded by ``limits.max_tokens``).
An error names the offending field in ``param``.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, replace
from typing import Any, Literal

from fairq_server.backends.request import BackendRequest, Sampling
from fairq_server.config.schema import RequestBounds
from fairq_server.doors.estimate import CHARS_PER_TOKEN
from fairq_server.doors.passthrough import check_extra, output_bound, string_chars
from fairq_server.errors import InvalidRequestError
from fairq_server.names import check_request_id

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "Kind", "ParsedRequest", "Prompt", "parse_request"]

Kind = Literal["chat", "completion"]
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
_INTERPRETED = frozenset(
    {
        "model", "messages", "prompt", "stream", "max_tokens", "temperature", "top_p",
        "stop", "seed", "ignore_eos", "request_id", "priority", "n",
    }
)  # fmt: skip
_MAX_USER_CHARS = 128
#: The output bound of a completions request that gives none (OpenAI's and vLLM's default).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class ParsedRequest:
    """A checked HTTP request.

    Attributes:
        request: what goes to the backend.
        kind: chat or completion.
        stream: the caller wants server-sent events.
        include_usage: the caller asked for the usage chunk (fairq always asks the backend).
        user: the body's ``user`` field, if a string.
        batch: for a list of prompts or ``n`` > 1, one request per prompt and choice,
            prompt-major (``request`` is the first); empty for one prompt and one choice.
        choices: ``n``, the choices asked for per prompt.

    """

    request: BackendRequest
    kind: Kind
    stream: bool
    include_usage: bool
    user: str | None
    batch: tuple[BackendRequest, ...] = ()
    choices: int = 1


def _bad(message: str, param: str | None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _integer(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{key} must be an integer, not {type(value).__name__}", key)
    return value


def _number(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{key} must be a finite number", key)
    return float(value)


def _text_of(content: object, where: str) -> str:
    """Return the text of a message's content (a string, or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise _bad(f"{where}.content[{i}] must be an object", f"{where}.content[{i}]")
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
        return "".join(texts)
    raise _bad(f"{where}.content must be a string, a list of parts or null", f"{where}.content")


def _messages(
    raw: object, limits: RequestBounds
) -> tuple[tuple[tuple[str, str], ...], tuple[dict[str, Any], ...]]:
    if not isinstance(raw, list):
        raise _bad("messages must be a list", "messages")
    if not raw:
        raise _bad("messages is empty", "messages")
    if len(raw) > limits.max_messages:
        raise _bad(f"{len(raw)} messages; the limit is {limits.max_messages}", "messages")
    pairs = []
    total = 0
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            shown = str(role)[:32]
            raise _bad(
                f"messages[{i}].role '{shown}' is not one of {', '.join(sorted(_ROLES))}",
                f"messages[{i}].role",
            )
        # Every string of a message reaches the engine (tool call arguments, names,
        # reasoning, image URLs), so all of them count against the prompt limit.
        chars = string_chars(m, limits.max_extra_depth)
        if chars is None:
            raise _bad(
                f"messages[{i}] is nested deeper than {limits.max_extra_depth} levels",
                f"messages[{i}]",
            )
        total += chars
        pairs.append((role, _text_of(m.get("content"), f"messages[{i}]")))
    if total > limits.max_prompt_chars:
        raise _bad(
            f"messages have {total} characters; the limit is {limits.max_prompt_chars}",
            "messages",
        )
    return tuple(pairs), tuple(raw)


Prompt = str | tuple[int, ...]
_TOKEN_LIMIT = 2**31


def _prompts(raw: object, limits: RequestBounds) -> tuple[Prompt, ...]:
    """Return the prompts of a completions body: a string, token ids, or a list of either.

    Each prompt is bounded by ``max_prompt_chars`` (a token id counting as
    :data:`~fairq_server.doors.estimate.CHARS_PER_TOKEN` characters, the figure fairq
    estimates by), the list by ``max_prompts``.
    """
    if isinstance(raw, str):
        return (_text_prompt(raw, "prompt", limits),)
    if not isinstance(raw, list):
        raise _bad(
            "prompt must be a string, a list of strings, token ids or a list of token ids",
            "prompt",
        )
    if not raw:
        raise _bad("prompt is an empty list", "prompt")
    if isinstance(raw[0], int):  # token ids (each checked by _token_prompt)
        return (_token_prompt(raw, "prompt", limits),)
    if len(raw) > limits.max_prompts:
        raise _bad(
            f"prompt is a list of {len(raw)} prompts; the limit is {limits.max_prompts}",
            "prompt",
        )
    prompts: list[Prompt] = []
    for i, item in enumerate(raw):
        where = f"prompt[{i}]"
        if isinstance(item, str):
            prompts.append(_text_prompt(item, where, limits))
        elif isinstance(item, list):
            prompts.append(_token_prompt(item, where, limits))
        else:
            raise _bad(f"{where} must be a string or a list of token ids", where)
    return tuple(prompts)


def _text_prompt(raw: str, where: str, limits: RequestBounds) -> str:
    if not raw.strip():
        raise _bad(f"{where} is empty", where)
    if len(raw) > limits.max_prompt_chars:
        raise _bad(
            f"{where} has {len(raw)} characters; the limit is {limits.max_prompt_chars}", where
        )
    return raw


def _token_prompt(raw: list[Any], where: str, limits: RequestBounds) -> tuple[int, ...]:
    if not raw:
        raise _bad(f"{where} is an empty list of token ids", where)
    limit = limits.max_prompt_chars // CHARS_PER_TOKEN
    if len(raw) > limit:
        raise _bad(
            f"{where} has {len(raw)} token ids; the limit is {limit} "
            f"(max_prompt_chars / {CHARS_PER_TOKEN})",
            where,
        )
    for j, t in enumerate(raw):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < _TOKEN_LIMIT:
            raise _bad(f"{where}[{j}] must be a token id, an integer in [0, 2^31)", f"{where}[{j}]")
    return tuple(raw)


def _stop(raw: object, limits: RequestBounds) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop must be a string or a list of strings", "stop")
    if len(stops) > limits.max_stop_strings:
        raise _bad(f"stop has {len(stops)} strings; the limit is {limits.max_stop_strings}", "stop")
    if any(not s or len(s) > limits.max_stop_chars for s in stops):
        raise _bad(f"stop strings must be 1-{limits.max_stop_chars} characters", "stop")
    return tuple(stops)


def _sampling(body: dict[str, Any], limits: RequestBounds, kind: Kind) -> Sampling:
    max_tokens = _integer(body, "max_tokens")
    for key in ("max_tokens", "max_completion_tokens"):  # on either route: engines may read both
        value = _integer(body, key)
        if value is not None and not 1 <= value <= limits.max_tokens:
            raise _bad(f"{key} must be between 1 and {limits.max_tokens}, got {value}", key)
    if max_tokens is None and kind == "chat":
        max_tokens = _integer(body, "max_completion_tokens")
    defaulted = max_tokens is None
    if defaulted and kind == "completion" and body.get("max_completion_tokens") is None:
        # The completions API's own default (OpenAI's and vLLM's), not the rest of the
        # context: a caller of /v1/completions who gives no bound expects 16 tokens.
        max_tokens, defaulted = min(COMPLETIONS_DEFAULT_MAX_TOKENS, limits.max_tokens), False
    temperature = _number(body, "temperature")
    if temperature is not None and not 0 <= temperature <= 2:
        raise _bad(f"temperature must be in [0, 2], got {temperature}", "temperature")
    top_p = _number(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise _bad(f"top_p must be in (0, 1], got {top_p}", "top_p")
    ignore_eos = body.get("ignore_eos")
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos must be true or false", "ignore_eos")
    return Sampling(
        max_tokens=output_bound(limits, max_tokens),
        max_tokens_defaulted=defaulted,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        stop=_stop(body.get("stop"), limits),
        seed=_integer(body, "seed"),
        ignore_eos=bool(ignore_eos),
    )


def parse_request(body: object, kind: Kind, limits: RequestBounds) -> ParsedRequest:
    """Check an OpenAI chat or completions body and build the backend request.

    Raises:
        InvalidRequestError: naming the offending field.

    """
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required (a string)", "model")
    if len(model) > 256:
        raise _bad("model name is longer than 256 characters", "model")
    if "priority" in body:
        raise _bad("priority is set by fairq from the request's tier (x-fairq-tier)", "priority")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    messages: tuple[tuple[str, str], ...] | None = None
    raw_messages: tuple[dict[str, Any], ...] | None = None
    prompts: tuple[Prompt, ...] = ()
    if kind == "chat":
        if "prompt" in body:
            raise _bad("prompt belongs to /v1/completions; chat takes messages", "prompt")
        messages, raw_messages = _messages(body.get("messages"), limits)
    else:
        if "messages" in body:
            raise _bad(
                "messages belong to /v1/chat/completions; completions take a prompt", "messages"
            )
        prompts = _prompts(body.get("prompt"), limits)
    request_id = body.get("request_id")
    if request_id is not None:
        if not isinstance(request_id, str):
            raise _bad("request_id must be a string", "request_id")
        try:
            check_request_id(request_id)  # the gRPC door's rule
        except ValueError as exc:
            raise _bad(str(exc), "request_id") from None
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > _MAX_USER_CHARS):
        raise _bad(f"user must be a string of at most {_MAX_USER_CHARS} characters", "user")
    sampling = _sampling(body, limits, kind)
    choices = _choices(body, limits)
    extra = {k: v for k, v in body.items() if k not in _INTERPRETED}
    extra = check_extra(extra, limits, field="the request's other fields", reserved=(),
                        from_struct=False)  # fmt: skip
    first = BackendRequest(
        model=model,
        messages=messages,
        raw_messages=raw_messages,
        sampling=sampling,
        request_id=request_id or uuid.uuid4().hex,
        extra=extra,
    )
    requests = [_with_prompt(first, p) for p in prompts] or [first]
    if choices > 1:
        requests = [_choice(r, j) for r in requests for j in range(choices)]
    if len(requests) > 1:
        # Each prompt of a list, and each choice, is its own request, with its own id (for
        # logs and engines).
        requests = [replace(r, request_id=f"{r.request_id}-{i}") for i, r in enumerate(requests)]
    return ParsedRequest(
        request=requests[0],
        kind=kind,
        stream=bool(stream),
        include_usage=include_usage,
        user=user,
        batch=tuple(requests) if len(requests) > 1 else (),
        choices=choices,
    )


def _choices(body: dict[str, Any], limits: RequestBounds) -> int:
    """Return ``n``, the choices asked for (1 when not given)."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _bad("n must be a positive integer", "n")
    if n > limits.max_choices:
        raise _bad(f"n is {n}; the limit is {limits.max_choices} (limits.max_choices)", "n")
    return n


def _choice(request: BackendRequest, index: int) -> BackendRequest:
    """Return choice ``index`` of ``request``: a seed becomes ``seed + index``, as in vLLM.

    vLLM runs ``n`` as ``n`` requests of one sequence each and seeds the ``index``-th with
    ``seed + index``, so the choices differ and each is reproducible.
    """
    seed = request.sampling.seed
    if seed is None or index == 0:
        return request
    return replace(request, sampling=replace(request.sampling, seed=seed + index))


def _with_prompt(request: BackendRequest, prompt: Prompt) -> BackendRequest:
    if isinstance(prompt, str):
        return replace(request, prompt=prompt)
    return replace(request, prompt_token_ids=prompt)
