"""Reading OpenAI bodies: what fairq interprets, what it passes through, what it refuses."""

from __future__ import annotations

import pytest

from fairq_server.config import Limits
from fairq_server.errors import InvalidRequestError
from fairq_server.http.parse import parse_request


def test_pass_through_and_interpreted_fields() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "},
                                         {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"},
        ],
        "max_completion_tokens": 9, "temperature": 0, "stop": "END", "stream": True,
        "stream_options": {"include_usage": True}, "tools": [{"type": "function"}],
        "response_format": {"type": "json_object"}, "n": 2, "top_k": 3, "user": "ann",
    }  # fmt: skip
    parsed = parse_request(body, "chat", Limits(max_sequences=2))
    r = parsed.request
    assert parsed.stream and parsed.include_usage and parsed.user == "ann"
    assert r.messages == (("system", "be brief"), ("user", "hi there"), ("assistant", ""),
                          ("tool", "42"))  # fmt: skip
    assert r.raw_messages is not None and r.raw_messages[2]["tool_calls"][0]["id"] == "c"
    assert r.sampling.stop == ("END",) and r.sampling.temperature == 0
    assert r.sampling.max_tokens == 9  # max_completion_tokens is the bound too
    assert r.extra == {
        "max_completion_tokens": 9, "stream_options": {"include_usage": True},
        "tools": [{"type": "function"}], "response_format": {"type": "json_object"},
        "n": 2, "top_k": 3, "user": "ann",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "prompt": ["a", "b"]}, "one prompt per request"),
        ({"model": "m", "prompt": 5}, "prompt must be a string"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens must be an integer"),
        ({"model": "m", "prompt": "x", "top_p": 0}, "top_p must be in (0, 1]"),
        ({"model": "m", "prompt": "x", "stop": ["a"] * 5}, "stop has 5 strings"),
        ({"model": "m", "prompt": "x", "seed": 1.5}, "seed must be an integer"),
        ({"model": "m", "prompt": "x", "user": 7}, "user must be a string"),
        ({"model": "m", "prompt": "x", "stream_options": []}, "stream_options must be an object"),
        ({"model": "m", "prompt": "x", "temperature": float("nan")}, "finite number"),
    ],
)
def test_refusals(body: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=needle.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):  # fmt: skip
        parse_request(body, "completion", Limits())
