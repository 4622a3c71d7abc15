"""The OpenAI-compatible request body fairq sends (vLLM and the generic ``openai`` kind)."""

from __future__ import annotations

import json
from typing import Any

import orjson

from fairq_server.backends.request import BackendRequest

__all__ = ["STREAM_HEADERS", "json_body", "openai_body"]


def openai_body(request: BackendRequest, context: int | None = None) -> tuple[str, dict[str, Any]]:
    """Return the path and streaming JSON body of ``request`` for an OpenAI-compatible API.

    Pass-through parameters go in first; fairq's own fields are set over them: the model,
    the input, ``stream`` (fairq always streams from the backend, to see the first token),
    usage in the stream (fairq charges tokens by it; a caller's other ``stream_options``
    are kept) and the validated sampling parameters.

    ``context`` is the model's context length where the backend's ``/v1/models`` said it
    (vLLM's ``max_model_len``). A bound fairq chose for a caller who gave none is sent at
    most that: vLLM refuses a ``max_tokens`` above the context (a 400 for every such caller
    when ``limits.max_tokens`` is larger) and caps one that only leaves too little room for
    the prompt, so the model's whole context stays available and the limit still holds. A
    bound the caller gave is sent as given, so fairq answers as the engine would.
    """
    s = request.sampling
    body: dict[str, Any] = dict(request.extra)
    options = body.get("stream_options")
    body["model"] = request.model
    body["stream"] = True
    body["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    if request.messages is not None:
        path = "/v1/chat/completions"
        body["messages"] = (
            [dict(m) for m in request.raw_messages]
            if request.raw_messages is not None
            else [{"role": r, "content": c} for r, c in request.messages]
        )
    else:
        path = "/v1/completions"
        ids = request.prompt_token_ids
        body["prompt"] = list(ids) if ids is not None else request.prompt
    bound = s.max_tokens
    if bound is not None and s.max_tokens_defaulted and context is not None:
        bound = min(bound, context)
    optional = {
        "max_tokens": bound,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "stop": list(s.stop) or None,
        "ignore_eos": s.ignore_eos or None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return path, body


#: The headers of a generation request (its body is JSON, its answer a stream of events).
STREAM_HEADERS = {"accept": "text/event-stream", "content-type": "application/json"}


def json_body(payload: dict[str, Any]) -> bytes:
    """Encode a request body as the standard library does, with orjson where that is the same.

    orjson takes a tenth of the time, but refuses integers beyond 64 bits and writes NaN and
    infinities as ``null`` (a caller's pass-through parameters may hold either; the standard
    library writes ``NaN``, which the backend then refuses as before). Those bodies, and any
    with a ``null`` at all, are encoded by the standard library.
    """
    try:
        body = orjson.dumps(payload)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        body = b"null"
    return json.dumps(payload).encode() if b"null" in body else body
