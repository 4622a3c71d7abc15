"""The names each backend kind reads as a request's output bound, and as several sequences.

fairq bounds a request's output with ``limits.max_tokens`` and sends the bound under the
OpenAI names (``max_tokens``; ``max_new_tokens`` in TGI's ``/generate_stream``
parameters). Engines also read their own names for the same bound, and some of them win over
``max_tokens`` (llama.cpp reads ``n_predict`` first). A pass-through parameter under any of
these names would walk around the limit, so the doors refuse them all, whatever the kind of
the backend that will serve the request (a request may be routed to any kind serving its
model).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ENGINE_TOKEN_LIMITS", "SEQUENCE_COUNTS", "TOKEN_LIMITS_BY_KIND"]

#: Per backend kind, the request fields its engines read as the output bound.
TOKEN_LIMITS_BY_KIND: Mapping[str, frozenset[str]] = {
    "vllm": frozenset({"max_tokens", "max_completion_tokens"}),
    # /generate_stream's parameters, and the Messages API
    "tgi": frozenset({"max_new_tokens", "max_tokens"}),
    # SGLang's native name, llama.cpp's native name, the OpenAI ones
    "openai": frozenset({"max_tokens", "max_completion_tokens", "max_new_tokens", "n_predict"}),
}

#: The engine-native names a caller may not use (OpenAI's own are checked by the doors).
ENGINE_TOKEN_LIMITS: frozenset[str] = frozenset().union(*TOKEN_LIMITS_BY_KIND.values()) - {
    "max_tokens",
    "max_completion_tokens",
}

#: Fields that make the engine generate several sequences for one request (one fairq slot).
SEQUENCE_COUNTS = ("n", "best_of")
