"""A request's prompt length in tokens, estimated without a tokenizer (for cost ordering)."""

from __future__ import annotations

import math

from fairq_server.backends.request import BackendRequest

__all__ = ["CHARS_PER_TOKEN", "estimate_tokens"]

# Cheap, tokenizer-free estimate used only for cost ordering; ~4 characters per token is the
# usual figure for English text with BPE vocabularies.
CHARS_PER_TOKEN = 4


def estimate_tokens(request: BackendRequest) -> int:
    """Estimate the prompt's length in tokens (a token-id prompt's is its length)."""
    if request.prompt_token_ids is not None:
        return max(1, len(request.prompt_token_ids))
    if request.messages is not None:
        chars = sum(len(c) + len(r) + 4 for r, c in request.messages)
    else:
        chars = len(request.prompt or "")
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))
