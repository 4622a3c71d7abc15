"""Continuing a preempted generation on each kind of backend.

fairq preempts a running request by closing its stream (the engine aborts it) and later sends
a *continuation*: the same request asking for the rest of its output, with what it generated
so far as part of its input (see ``docs/design/preemption.md``). This module is what that
means on the wire, per backend kind:

- vLLM, completions: the prompt becomes the token ids of prompt plus output (the engine returns
  both with ``return_token_ids``), so the continuation is token-exact.
- Any OpenAI-compatible engine, completions (and vLLM where no ids came back): the prompt plus
  the generated text.
- Chat: the generated text as a final assistant message that the engine continues
  (``continue_final_message``, as vLLM and SGLang name it; llama.cpp's server continues a final
  assistant message by itself). TGI's Messages API cannot continue a message: chat requests are
  never preempted there.
- TGI ``/generate_stream``: ``inputs`` plus the generated text.

``max_tokens`` (and ``min_tokens``) shrink by the tokens already generated. The usage the caller
sees is the sum over attempts: the continuation's prompt counts the earlier output, which is
moved back to the completion side (the total is unchanged).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fairq_server.backends.request import BackendRequest, Resume, TextDelta

__all__ = [
    "Progress",
    "continue_openai",
    "continue_tgi",
    "exempt_reason",
    "predicted_tokens",
    "relay_payload",
    "resumed_usage",
    "short_of_room",
]

# Pass-through fields whose meaning a continuation would change: several choices, per-token
# detail the caller reads, an echoed prompt, or a grammar that would restart mid-output.
_EXEMPT_FIELDS = (
    ("logprobs", "logprobs"),
    ("top_logprobs", "logprobs"),
    ("prompt_logprobs", "logprobs"),
    ("echo", "echo"),
    ("response_format", "structured output"),
    ("guided_json", "structured output"),
    ("guided_regex", "structured output"),
    ("guided_choice", "structured output"),
    ("guided_grammar", "structured output"),
    ("structured_outputs", "structured output"),
    ("grammar", "structured output"),
    ("json_schema", "structured output"),
)
# Keys fairq adds for itself when it asks for token ids; stripped before relaying.
_ID_KEYS = ("token_ids", "prompt_token_ids")


def exempt_reason(request: BackendRequest, *, continues_chat: bool) -> str | None:
    """Return why ``request`` may never be preempted (None: it may).

    ``continues_chat``: the backend can continue a chat request (not TGI's Messages API).

    A ``seed`` is exempt because the engine would draw the rest from a fresh generator: the
    output would differ from the one the caller asked to reproduce.
    """
    if request.sampling.seed is not None:
        return "seed"
    if request.sampling.stop or request.extra.get("stop"):
        # A stop string could straddle the preemption point, and an engine holds back text
        # that may begin one: neither would be seen again by the continuation.
        return "stop"
    extra = request.extra
    for key in ("n", "best_of"):
        value = extra.get(key)
        if isinstance(value, int) and value > 1:
            return "n"
    for key, reason in _EXEMPT_FIELDS:
        if extra.get(key) not in (None, False, 0):
            return reason
    if request.messages is not None and not continues_chat:
        return "chat not continued here"
    return None


class Progress:
    """What a request's attempts have generated so far (written as its stream is read).

    Attributes:
        parts: the generated text, as it came.
        tokens: the generated tokens.
        token_ids: the prompt's then the output's token ids, while every delta carried them.
        beside_text: a delta carried more than text (a tool call, logprobs): the output is
            not plain text and cannot be continued.
        chunk_id: the first attempt's OpenAI chunk ``id``.
        created: its ``created``.
        preemptions: how often the request was preempted.

    """

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.tokens = 0
        self.token_ids: list[int] | None = None
        self._exact = True
        self.beside_text = False
        self.chunk_id: str | None = None
        self.created: int | None = None
        self.preemptions = 0
        # Where the text sent so far ends: ids and tokens up to the last delta with text.
        # Tokens after it are bytes of a character the engine has not sent yet; a
        # continuation starts before them (and generates them again).
        self._clean_ids = 0
        self._clean_tokens = 0
        # Tokens carried into the current attempt: an engine's own count of the attempt's
        # output (llama.cpp's ``timings.predicted_n``) is counted from here.
        self._base = 0

    def record(self, delta: TextDelta) -> None:
        """Add one delta of the current attempt (a relayed chunk batch or gRPC text)."""
        objects: tuple[Mapping[str, Any], ...] = getattr(delta, "objects", ())
        if objects:
            for obj in objects:
                self._record_chunk(obj)
            return
        self.tokens += delta.tokens
        if delta.extra:
            self.beside_text = True
        self._ids(delta.prompt_token_ids, delta.token_ids, delta.tokens)
        if delta.text:
            self.parts.append(delta.text)
            self._clean()

    def _record_chunk(self, obj: Mapping[str, Any]) -> None:
        predicted = predicted_tokens(obj)
        if self.chunk_id is None and isinstance(obj.get("id"), str):
            self.chunk_id = obj["id"]
            created = obj.get("created")
            self.created = created if isinstance(created, int) else None
        for choice in obj.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                text = delta.get("content")
                if any(delta.get(k) for k in ("tool_calls", "reasoning_content", "reasoning")):
                    self.beside_text = True
            else:
                text = choice.get("text")
            if choice.get("logprobs"):
                self.beside_text = True
            ids = choice.get("token_ids")
            count = len(ids) if isinstance(ids, list) else (1 if text else 0)
            if predicted is not None and not isinstance(ids, list):
                # The engine's own count also covers tokens it sent no chunk for (the bytes
                # of an incomplete character, held back until the character completes).
                count = max(0, self._base + predicted - self.tokens)
            self.tokens += count
            prompt = choice.get("prompt_token_ids") or obj.get("prompt_token_ids")
            self._ids(
                tuple(prompt) if isinstance(prompt, list) else None,
                tuple(ids) if isinstance(ids, list) else (),
                count,
            )
            if isinstance(text, str) and text:
                self.parts.append(text)
                self._clean()

    def _clean(self) -> None:
        """Mark the text sent so far as complete up to here."""
        self._clean_tokens = self.tokens
        self._clean_ids = len(self.token_ids) if self.token_ids is not None else 0

    def _ids(self, prompt: tuple[int, ...] | None, ids: tuple[int, ...], count: int) -> None:
        if not self._exact:
            return
        if prompt is not None and self.token_ids is None:
            self.token_ids = list(prompt)
            self._clean_ids = len(prompt)
        if count and (self.token_ids is None or len(ids) != count):
            self._exact = False  # a delta without its ids: continue from the text
            self.token_ids = None
            return
        if self.token_ids is not None:
            self.token_ids.extend(ids)

    @property
    def carried(self) -> int:
        """Tokens carried into the current attempt by an earlier preemption (0: none)."""
        return self._base

    @property
    def exact(self) -> bool:
        """Whether every delta so far carried its token ids (a continuation can send them)."""
        return self._exact and self.token_ids is not None

    @property
    def text(self) -> str:
        """The generated text so far."""
        return "".join(self.parts)

    def resume(self) -> Resume:
        """Return what the continuation carries; the progress restarts from there.

        Tokens read after the text sent so far ends (an incomplete character's bytes) are
        generated again by the continuation: they are dropped here, so that they are neither
        counted twice nor sent twice among a later continuation's ids.
        """
        ids = None
        if self._exact and self.token_ids is not None:
            del self.token_ids[self._clean_ids :]
            ids = tuple(self.token_ids)
        self.tokens = self._base = self._clean_tokens
        return Resume(self.text, self._clean_tokens, ids, self.chunk_id, self.created)


#: How much longer a continuation's input may come out than the tokens it carries, when the
#: engine tokenizes the generated text again: a model's own tokens are not always the
#: tokenizer's split of their text (measured: 7-9 % longer on the simulator's tokenizer).
TEXT_SLACK = 0.25


def short_of_room(
    request: BackendRequest,
    progress: Progress,
    context: int | None,
    prompt: int,
    *,
    by_ids: bool,
) -> bool:
    """Whether a continuation of ``request`` by its text might not fit the model's context.

    The engine counts a text continuation's input by tokenizing the generated text again, and
    refuses it (context length exceeded) if that count and the remaining ``max_tokens`` pass
    the context, though the request as first sent fitted. A continuation by token ids
    (``by_ids``: the backend continues completions so, and every delta carried them) has the
    exact count; otherwise the request must leave room for its output to come out
    ``TEXT_SLACK`` longer. ``prompt``: the prompt's length in tokens (estimated).
    """
    if context is None or request.sampling.max_tokens is None:
        return False
    if by_ids and request.messages is None and progress.exact:
        return False
    slack = int(progress.tokens * TEXT_SLACK) + 1
    return prompt + request.sampling.max_tokens + slack > context


def predicted_tokens(obj: Mapping[str, Any]) -> int | None:
    """Return the tokens an attempt has generated as of this chunk, by the engine's own count.

    llama.cpp's server adds ``timings`` (with ``predicted_n``) to every chunk when asked with
    ``timings_per_token``. It sends no chunk for a token that ends inside a character, so
    counting chunks undercounts; its count does not. None when the chunk has no such count,
    or carries more than one choice (each choice is its own generation).
    """
    timings = obj.get("timings")
    if not isinstance(timings, dict) or len(obj.get("choices") or ()) > 1:
        return None
    predicted = timings.get("predicted_n")
    return predicted if type(predicted) is int and predicted >= 0 else None


def continue_openai(
    body: dict[str, Any], resume: Resume, *, token_ids: bool, chat_flag: bool = True
) -> None:
    """Turn an OpenAI-shaped request ``body`` into its continuation (in place).

    Args:
        body: the request's body as first sent.
        resume: what was generated.
        token_ids: the engine accepts a prompt of token ids (vLLM): use them when known.
        chat_flag: ask for ``continue_final_message`` (vLLM, SGLang); llama.cpp continues a
            final assistant message without it and ignores the field.

    """
    if "messages" in body:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": resume.text}]
        if chat_flag:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    elif token_ids and resume.token_ids is not None:
        body["prompt"] = list(resume.token_ids)
    else:
        body["prompt"] = f"{body.get('prompt') or ''}{resume.text}"
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int):
            body[key] = max(1, body[key] - resume.tokens)
    if isinstance(body.get("min_tokens"), int):
        body["min_tokens"] = max(0, body["min_tokens"] - resume.tokens)


def continue_tgi(body: dict[str, Any], resume: Resume) -> None:
    """Turn a TGI ``/generate_stream`` body into its continuation (in place)."""
    body["inputs"] = f"{body.get('inputs') or ''}{resume.text}"
    params = body.get("parameters")
    if isinstance(params, dict) and isinstance(params.get("max_new_tokens"), int):
        params["max_new_tokens"] = max(1, params["max_new_tokens"] - resume.tokens)


def resumed_usage(resume: Resume | None, prompt: int, completion: int) -> tuple[int, int]:
    """Return the caller's usage from a continuation's: earlier output moves to completion."""
    if resume is None or not prompt:
        return prompt, completion
    moved = min(resume.tokens, prompt)
    return prompt - moved, completion + moved


def relay_payload(
    obj: Mapping[str, Any],
    payload: str,
    resume: Resume | None,
    strip_ids: bool,
    strip_timings: bool = False,
) -> str | None:
    """Return the chunk to relay to the HTTP caller (None: drop it); ``obj`` is not changed.

    A continuation's chunks carry the first attempt's ``id`` and ``created`` and the summed
    usage; its opening role-only chunk is dropped (the caller had one). Token ids and timings
    fairq asked for itself are removed.
    """
    out = dict(obj)
    changed = strip_timings and out.pop("timings", None) is not None
    choices = obj.get("choices") or ()
    if strip_ids:
        for key in _ID_KEYS:
            changed |= out.pop(key, None) is not None
        if any(key in c for c in choices for key in _ID_KEYS):
            out["choices"] = [{k: v for k, v in c.items() if k not in _ID_KEYS} for c in choices]
            changed = True
    if resume is not None:
        if choices and all(_role_only(c) for c in choices):
            return None
        if resume.chunk_id is not None and obj.get("id") != resume.chunk_id:
            out["id"] = resume.chunk_id
            changed = True
        if resume.created is not None and "created" in obj:
            out["created"] = resume.created
            changed = True
        usage = obj.get("usage")
        if isinstance(usage, Mapping) and isinstance(usage.get("prompt_tokens"), int):
            prompt, completion = resumed_usage(
                resume, usage["prompt_tokens"], int(usage.get("completion_tokens") or 0)
            )
            out["usage"] = {**usage, "prompt_tokens": prompt, "completion_tokens": completion}
            changed = True
    return json.dumps(out, separators=(",", ":")) if changed else payload


def _role_only(choice: Mapping[str, Any]) -> bool:
    delta = choice.get("delta")
    return (
        isinstance(delta, Mapping)
        and not delta.get("content")
        and not delta.get("tool_calls")
        and not choice.get("finish_reason")
    )
