"""The OpenAI-compatible request body fairq sends (vLLM and the generic ``openai`` kind)."""

from __future__ import annotations

from typing import Any

from fairq_server.backends.request import BackendRequest

__all__ = ["openai_body"]


def openai_body(request: BackendRequest) -> tuple[str, dict[str, Any]]:
    """Return the path and streaming JSON body of ``request`` for an OpenAI-compatible API.

    Pass-through parameters go in first; fairq's own fields are set over them: the model,
    the input, ``stream`` (fairq always streams from the backend, to see the first token),
    usage in the stream (fairq charges tokens by it; a caller's other ``stream_options``
    are kept) and the validated sampling parameters.
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
    optional = {
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "stop": list(s.stop) or None,
        "ignore_eos": s.ignore_eos or None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return path, body
