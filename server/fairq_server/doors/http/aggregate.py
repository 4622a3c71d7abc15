"""Building a non-streaming answer from the backend's stream.

fairq always streams from the backend, also when the caller asked for one JSON answer: the
first token is what frees the backend's queue slot in the gate's count, and tokens are
charged to the user as they come. The chunks are then merged into the object the backend
would have answered without ``stream`` (OpenAI's ``chat.completion`` / ``text_completion``):
text and reasoning concatenated, tool calls assembled by index (arguments concatenated),
logprobs lists joined, the last finish reason, the final usage.

The merge is linear in the chunks: strings are gathered as parts and joined once, in
:meth:`ChunkMerger.result`, and logprobs lists are extended in place (a copy per chunk made
a 32,768-token answer with 20 top logprobs take seconds of event-loop time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ChunkMerger"]

_CONCAT = ("content", "reasoning_content", "reasoning", "refusal")


class _Parts:
    """A string built by appending: parts kept, joined once."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[str] = []


class ChunkMerger:
    """Accumulates stream chunks of one request; :meth:`result` gives the merged answer."""

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: Any = None

    def add(self, chunks: Iterable[Mapping[str, Any]]) -> None:
        """Merge parsed chunks, in stream order."""
        for chunk in chunks:
            if not self._head:
                self._head = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
            elif chunk.get("system_fingerprint") is not None:
                self._head["system_fingerprint"] = chunk["system_fingerprint"]
            if chunk.get("usage"):
                self._usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if isinstance(choice, Mapping):
                    self._add_choice(choice)

    def _add_choice(self, choice: Mapping[str, Any]) -> None:
        index = choice.get("index", 0)
        index = index if isinstance(index, int) else 0
        merged = self._choices.setdefault(index, self._new_choice(index))
        if self._chat:
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._add_delta(merged["message"], delta)
        else:
            text = choice.get("text")
            if isinstance(text, str):
                merged["text"].parts.append(text)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, Mapping):
            merged["logprobs"] = _join_logprobs(merged["logprobs"], logprobs)
        for key, value in choice.items():
            if key in ("index", "delta", "text", "logprobs"):
                continue
            if value is not None or key not in merged:
                merged[key] = value

    def _new_choice(self, index: int) -> dict[str, Any]:
        if self._chat:
            message = {"role": "assistant", "content": None}
            return {"index": index, "message": message, "logprobs": None, "finish_reason": None}
        return {"index": index, "text": _Parts(), "logprobs": None, "finish_reason": None}

    @staticmethod
    def _add_delta(message: dict[str, Any], delta: Mapping[str, Any]) -> None:
        for key, value in delta.items():
            if key in _CONCAT and isinstance(value, str):
                parts = message.get(key)
                if not isinstance(parts, _Parts):
                    parts = message[key] = _Parts()
                parts.parts.append(value)
            elif key == "tool_calls" and isinstance(value, list):
                calls: list[dict[str, Any]] = message.setdefault("tool_calls", [])
                for piece in value:
                    if isinstance(piece, Mapping):
                        _add_tool_call(calls, piece)
            elif key == "role" and isinstance(value, str):
                message["role"] = value
            elif value is not None:
                message[key] = value

    def result(self) -> dict[str, Any]:
        """Return the merged answer."""
        body = dict(self._head)
        if self._chat:
            body["object"] = "chat.completion"
        else:
            body["object"] = "text_completion"
        body["choices"] = [_joined(self._choices[i]) for i in sorted(self._choices)]
        if self._chat:
            for choice in body["choices"]:
                message = choice["message"]
                # Engines stream a role chunk with content "" before tool-call deltas; their
                # own non-streamed answer says null, which clients test for.
                if message.get("tool_calls") and message.get("content") == "":
                    message["content"] = None
        if self._usage is not None:
            body["usage"] = self._usage
        return body


def _joined(value: Any) -> Any:
    """Return ``value`` with every :class:`_Parts` inside joined into its string.

    Logprobs are the backend's own objects and hold no parts: they are passed as they are, so
    the walk costs the message, not an entry per token with its top alternatives.
    """
    if isinstance(value, _Parts):
        return "".join(value.parts)
    if isinstance(value, dict):
        return {k: v if k == "logprobs" else _joined(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_joined(v) for v in value]
    return value


def _add_tool_call(calls: list[dict[str, Any]], piece: Mapping[str, Any]) -> None:
    index = piece.get("index", len(calls))
    while len(calls) <= (index if isinstance(index, int) else len(calls)):
        calls.append(
            {"id": None, "type": "function", "function": {"name": _Parts(), "arguments": _Parts()}}
        )
    call = calls[index if isinstance(index, int) else -1]
    for key, value in piece.items():
        if key == "index":
            continue
        if key == "function" and isinstance(value, Mapping):
            fn = call["function"]
            for part in ("name", "arguments"):
                if isinstance(value.get(part), str):
                    fn[part].parts.append(value[part])
        elif value is not None:
            call[key] = value


def _join_logprobs(old: Any, new: Mapping[str, Any]) -> dict[str, Any]:
    """Append the list fields of ``new`` to ``old`` (chat ``content``, completions' lists).

    ``old`` is the merger's own object (made here from the first chunk's), so it is extended
    in place: linear in the number of entries, where a copy per chunk was quadratic.
    """
    if not isinstance(old, dict):
        return {k: list(v) if isinstance(v, list) else v for k, v in new.items()}
    for key, value in new.items():
        if isinstance(value, list) and isinstance(old.get(key), list):
            old[key].extend(value)
        elif value is not None:
            old[key] = value
    return old
