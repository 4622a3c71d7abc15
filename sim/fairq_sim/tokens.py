"""Cheap deterministic tokenisation and text generation.

The simulator needs token counts, not language. A prompt becomes a BOS token followed by one
token per 4 bytes of its UTF-8 encoding (rounded up), so ``"Hello, world"`` (12 bytes) is 4
tokens; identical prefixes give identical token ids, which is what the prefix cache needs.
Chat requests are first rendered with a minimal template (:func:`render_chat`).

Generated tokens come from a fixed vocabulary of English word pieces, chosen by a hash of the
request's seed and the token's position, so a request with the same seed always produces the
same text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = [
    "BOS_TOKEN_ID",
    "BYTES_PER_TOKEN",
    "EOS_TEXT",
    "EOS_TOKEN_ID",
    "count_tokens",
    "eos_position",
    "mix64",
    "render_chat",
    "sample_token",
    "token_logprob",
    "token_text",
    "tokenize",
]

BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
EOS_TEXT = "</s>"
BYTES_PER_TOKEN = 4
# Prompt token ids are the 4-byte chunk's integer value shifted past the special ids.
_PROMPT_ID_OFFSET = 3
_VOCAB_OFFSET = 100
_VOCAB = (
    " the", " of", " and", " to", " a", " in", " is", " that", " for", " it",
    " as", " with", " was", " on", " be", " by", " this", " are", " from", " at",
    " or", " an", " which", " not", " have", " model", " token", " queue", " batch", " user",
    " fair", " time", " request", " server", " cache", " block", " prefix", " step", " data",
    " system", " value", " result", " first", " next", " each", " more", " over", " under",
    "ing", "ed", "ly", "s", ",", ".", " new", " long", " short", " fast", " slow", " light",
)  # fmt: skip
_MASK = (1 << 64) - 1


def tokenize(text: str) -> list[int]:
    """Return the token ids of ``text``: BOS, then one id per 4 UTF-8 bytes."""
    data = text.encode("utf-8")
    ids = [BOS_TOKEN_ID]
    ids.extend(
        int.from_bytes(data[i : i + BYTES_PER_TOKEN], "little") + _PROMPT_ID_OFFSET
        for i in range(0, len(data), BYTES_PER_TOKEN)
    )
    return ids


def count_tokens(text: str) -> int:
    """Return ``len(tokenize(text))`` without building the list."""
    return 1 + -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def render_chat(messages: Iterable[Mapping[str, object]]) -> str:
    """Render chat messages into one prompt with a minimal template.

    Content may be a string or a list of OpenAI content parts; only text parts count.
    """
    parts = []
    for message in messages:
        role = str(message.get("role", "user"))
        content = message.get("content")
        if isinstance(content, list):
            text = "".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
            )
        else:
            text = "" if content is None else str(content)
        parts.append(f"<|{role}|>\n{text}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def mix64(*values: int) -> int:
    """Hash integers into 64 bits (splitmix64 finaliser); stable across processes."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h


def sample_token(seed: int, index: int) -> int:
    """Return the id of output token number ``index`` (0-based) for a request seeded ``seed``."""
    return _VOCAB_OFFSET + mix64(seed, index) % len(_VOCAB)


def token_text(token_id: int, *, skip_special: bool = True) -> str:
    """Return the text of a generated token id; EOS is ``""`` unless ``skip_special`` is off."""
    if token_id == EOS_TOKEN_ID:
        return "" if skip_special else EOS_TEXT
    return _VOCAB[(token_id - _VOCAB_OFFSET) % len(_VOCAB)]


def token_logprob(seed: int, index: int) -> float:
    """Return a plausible, deterministic log-probability for a generated token."""
    return -round((mix64(seed, index, 1) % 20_000) / 10_000, 4)


def eos_position(seed: int, mean_tokens: float) -> int:
    """Return the 1-based output position of an EOS token, geometric with the given mean."""
    if mean_tokens <= 1:
        return 1
    u = (mix64(seed, 0xE05) + 1) / (1 << 64)  # uniform in (0, 1]
    return 1 + int(math.log(u) / math.log(1 - 1 / mean_tokens))
