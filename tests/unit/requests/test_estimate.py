"""Prompt-length estimates, for text and for token ids."""

from __future__ import annotations

from fairq_server.backends.request import BackendRequest
from fairq_server.doors.estimate import estimate_tokens


def test_a_token_id_prompt_is_estimated_by_its_length() -> None:
    assert estimate_tokens(BackendRequest(model="m", prompt_token_ids=tuple(range(37)))) == 37
    assert estimate_tokens(BackendRequest(model="m", prompt="x" * 40)) == 10
