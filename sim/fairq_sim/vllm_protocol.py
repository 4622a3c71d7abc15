"""vLLM 0.32's OpenAI-compatible wire format: request validation and response bodies.

Shapes follow the recorded ``tests/fixtures/*.sse`` and ``error-*.txt``: compact JSON, keys in
vLLM's order, vLLM-only keys present as ``null``, errors nested as
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import JSONResponse

from fairq_sim.events import TokenOutput
from fairq_sim.tokens import render_chat, tokenize

__all__ = [
    "VERSION",
    "CompletionParams",
    "TextAccumulator",
    "VllmError",
    "chat_chunk",
    "completion_chunk",
    "parse_params",
    "usage",
]

VERSION = "0.32.0"
Kind = Literal["completion", "chat"]


class VllmError(Exception):
    """An error answered in vLLM's nested JSON shape.

    Args:
        status: HTTP status (also the body's ``code``).
        type_: vLLM's ``type``, e.g. ``BadRequestError``.
        message: Human-readable message.
        param: The offending parameter, if any.

    """

    def __init__(self, status: int, type_: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """Return the JSON body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }

    def response(self) -> JSONResponse:
        """Return the HTTP response."""
        return JSONResponse(self.body(), status_code=self.status)


def _bad_request(message: str, param: str | None = None) -> VllmError:
    """Return a 400 ``BadRequestError``."""
    return VllmError(400, "BadRequestError", message, param)


@dataclass
class CompletionParams:
    """What the simulator takes from a completions or chat request."""

    kind: Kind
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    priority: int
    ignore_eos: bool
    stop: tuple[str, ...]
    seed: int | None
    request_id: str | None
    tool: str | None = None
    return_token_ids: bool = False


def parse_params(
    body: dict[str, Any], kind: Kind, served_model: str, max_model_len: int
) -> CompletionParams:
    """Validate a request body as vLLM 0.32 does, for the fields the simulator uses.

    Raises:
        VllmError: 404 for an unknown model, 400 for invalid parameters.

    """
    model = body.get("model")
    if model is not None and model != served_model:
        raise VllmError(
            404,
            "NotFoundError",
            f"The model `{model}` does not exist. Valid aliases: {served_model}.",
            "model",
        )
    stream = bool(body.get("stream") or False)
    options = body.get("stream_options")
    if options and not stream:
        raise _bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    options = options if isinstance(options, dict) else {}
    if body.get("n", 1) not in (1, None):
        raise _bad_request("The simulator supports n=1 only.", "n")
    prompt_ids = _prompt_ids(body, kind)
    prompt_len = len(prompt_ids)
    if prompt_len >= max_model_len:
        raise _bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. Please reduce the length of the input "
            "messages.",
            "input_tokens",
        )
    requested = body.get("max_completion_tokens") if kind == "chat" else None
    if requested is None:
        requested = body.get("max_tokens", 16 if kind == "completion" else None)
    if requested is None:
        requested = max_model_len - prompt_len
    if not isinstance(requested, int) or isinstance(requested, bool) or requested < 1:
        raise _bad_request(f"max_tokens must be at least 1, got {requested}.", "max_tokens")
    if requested > max_model_len:
        raise _bad_request(
            f"max_tokens={requested} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={requested})",
            "max_tokens",
        )
    priority = body.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise _bad_request("priority must be an integer.", "priority")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop or ())
    seed = body.get("seed")
    request_id = body.get("request_id")
    tool = forced_tool(body) if kind == "chat" else None
    return CompletionParams(
        kind=kind,
        prompt_ids=prompt_ids,
        # vLLM V1 silently caps max_tokens at the room left in the context.
        max_tokens=min(requested, max_model_len - prompt_len),
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
        priority=priority,
        ignore_eos=bool(body.get("ignore_eos") or False),
        stop=tuple(s for s in stops if s),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        request_id=str(request_id) if request_id else None,
        tool=tool,
        return_token_ids=bool(body.get("return_token_ids")),
    )


def forced_tool(body: dict[str, Any]) -> str | None:
    """Return the function a chat request forces (named ``tool_choice`` or ``required``).

    The simulator then answers with one call of it whose arguments are ``{"text": ...}``
    holding the generated text, streamed piece by piece as vLLM streams arguments.

    Raises:
        VllmError: 400 when the choice names no function among ``tools``.

    """
    choice = body.get("tool_choice")
    tools = body.get("tools") or []
    names = [
        t["function"].get("name")
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    if choice == "required":
        if not names:
            raise _bad_request("tool_choice 'required' needs tools.", "tool_choice")
        return str(names[0])
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise _bad_request(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
        return str(name)
    return None


def _prompt_ids(body: dict[str, Any], kind: Kind) -> list[int]:
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise VllmError(400, "Bad Request", "Field required: messages", "messages")
        return tokenize(render_chat(m for m in messages if isinstance(m, dict)))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [int(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad_request("A list of prompts holds strings or lists of token ids.", "prompt")
    raise _bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")


class TextAccumulator:
    """Turns token outputs into text deltas, with vLLM's stop-string handling.

    With stop strings set, vLLM holds back the last ``len(longest stop) - 1`` characters of
    a stream until it knows they do not begin a stop string, and cuts the stop string (and
    anything after it) from the text.

    Args:
        stop: The request's stop strings.

    """

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self.text = ""
        self._sent = 0
        self._hold = max((len(s) for s in stop), default=1) - 1

    def push(self, output: TokenOutput) -> str:
        """Return the visible text this token releases."""
        before = len(self.text)
        self.text += output.text
        if output.finished:
            stop = output.request.stop_reason
            if stop:
                cut = self.text.find(stop, max(0, before - len(stop) + 1))
                if cut >= 0:
                    self.text = self.text[:cut]
            end = len(self.text)
        else:
            end = max(self._sent, len(self.text) - self._hold)
        delta = self.text[self._sent : end]
        self._sent = max(self._sent, end)
        return delta


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """Return a streamed usage object (key order as vLLM sends it)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def completion_chunk(
    response_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    stop_reason: str | None,
) -> dict[str, Any]:
    """Return one ``text_completion`` stream chunk."""
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def chat_chunk(
    response_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    stop_reason: str | None = None,
    *,
    first: bool = False,
) -> dict[str, Any]:
    """Return one ``chat.completion.chunk``; ``first`` is the role-only opening chunk."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
    choice["finish_reason"] = finish_reason
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    chunk: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if first:
        chunk["prompt_token_ids"] = None
        chunk["prompt_text"] = None
    else:
        choice["token_ids"] = None
    return chunk
