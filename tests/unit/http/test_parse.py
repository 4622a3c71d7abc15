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


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "type": "function",
                         "function": {"name": "f", "arguments": "x" * 2000}}]},
        {"role": "user", "name": "n" * 2000, "content": "hi"},
        {"role": "assistant", "content": "ok", "reasoning_content": "r" * 2000},
        {"role": "user", "content": [{"type": "image_url",
                                      "image_url": {"url": "data:," + "A" * 2000}}]},
    ],
)  # fmt: skip
def test_prompt_limit_counts_every_string_of_a_message(message: dict[str, object]) -> None:
    body = {"model": "m", "messages": [message]}
    with pytest.raises(
        InvalidRequestError, match=r"messages have \d+ characters; the limit is 1000"
    ):
        parse_request(body, "chat", Limits(max_prompt_chars=1000))
    assert parse_request(body, "chat", Limits(max_prompt_chars=3000)).request.raw_messages


def test_message_nesting_bounded_by_max_extra_depth() -> None:
    deep: object = "x"
    for _ in range(900):
        deep = [deep]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi", "meta": deep}]}
    with pytest.raises(InvalidRequestError, match=r"messages\[0\] is nested deeper than 32 levels"):
        parse_request(body, "chat", Limits())
    shallow = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
    }
    assert parse_request(shallow, "chat", Limits(max_extra_depth=3)).request.messages == (
        ("user", "a"),
    )
    with pytest.raises(InvalidRequestError, match="nested deeper than 2 levels"):
        parse_request(shallow, "chat", Limits(max_extra_depth=2))
