"""Reading OpenAI bodies: what fairq interprets, what it passes through, what it refuses."""

from __future__ import annotations

import pytest

from fairq_server.config.schema import RequestBounds
from fairq_server.doors.http.parse import parse_request
from fairq_server.errors import InvalidRequestError


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
    parsed = parse_request(body, "chat", RequestBounds(max_sequences=2))
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
        "top_k": 3, "user": "ann",
    }  # fmt: skip
    # n is fairq's: each choice its own request (own slot), the same body otherwise.
    assert parsed.choices == 2 and [c.request_id for c in parsed.batch] == [
        f"{r.request_id.rsplit('-', 1)[0]}-{i}" for i in range(2)
    ]
    assert all(c.extra == r.extra and c.sampling == r.sampling for c in parsed.batch)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "prompt": ["a"] * 65}, "a list of 65 prompts; the limit is 64"),
        ({"model": "m", "prompt": []}, "prompt is an empty list"),
        ({"model": "m", "prompt": ["a", 3]}, "prompt[1] must be a string or a list of token ids"),
        ({"model": "m", "prompt": ["a", " "]}, "prompt[1] is empty"),
        ({"model": "m", "prompt": [1, -1]}, "prompt[1] must be a token id"),
        ({"model": "m", "prompt": [1, 2**31]}, "prompt[1] must be a token id"),
        ({"model": "m", "prompt": [1, True]}, "prompt[1] must be a token id"),
        ({"model": "m", "prompt": [[1], []]}, "prompt[1] is an empty list of token ids"),
        ({"model": "m", "prompt": [[1], [0.5]]}, "prompt[1][0] must be a token id"),
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
        parse_request(body, "completion", RequestBounds())


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
        parse_request(body, "chat", RequestBounds(max_prompt_chars=1000))
    assert parse_request(body, "chat", RequestBounds(max_prompt_chars=3000)).request.raw_messages


def test_message_nesting_bounded_by_max_extra_depth() -> None:
    deep: object = "x"
    for _ in range(900):
        deep = [deep]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi", "meta": deep}]}
    with pytest.raises(InvalidRequestError, match=r"messages\[0\] is nested deeper than 32 levels"):
        parse_request(body, "chat", RequestBounds())
    shallow = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
    }
    assert parse_request(shallow, "chat", RequestBounds(max_extra_depth=3)).request.messages == (
        ("user", "a"),
    )
    with pytest.raises(InvalidRequestError, match="nested deeper than 2 levels"):
        parse_request(shallow, "chat", RequestBounds(max_extra_depth=2))


def test_prompt_shapes() -> None:
    limits = RequestBounds()
    one = parse_request({"model": "m", "prompt": ["only"], "request_id": "r"}, "completion", limits)
    assert one.batch == () and one.request.prompt == "only" and one.request.request_id == "r"
    ids = parse_request({"model": "m", "prompt": [5, 0, 2**31 - 1]}, "completion", limits)
    assert ids.batch == () and ids.request.prompt is None
    assert ids.request.prompt_token_ids == (5, 0, 2**31 - 1)
    body = {"model": "m", "prompt": ["a", [7, 8], "c"], "request_id": "r", "max_tokens": 3}
    many = parse_request(body, "completion", limits)
    assert [r.request_id for r in many.batch] == ["r-0", "r-1", "r-2"]
    assert [(r.prompt, r.prompt_token_ids) for r in many.batch] == [
        ("a", None), (None, (7, 8)), ("c", None)
    ]  # fmt: skip
    assert all(r.sampling.max_tokens == 3 for r in many.batch)
    assert many.request is many.batch[0]


def test_every_prompt_of_a_list_is_bounded() -> None:
    limits = RequestBounds(max_prompt_chars=40, max_prompts=3)
    parse_request({"model": "m", "prompt": ["x" * 40] * 3}, "completion", limits)
    with pytest.raises(
        InvalidRequestError, match=r"prompt\[2\] has 41 characters; the limit is 40"
    ):
        parse_request({"model": "m", "prompt": ["a", "b", "x" * 41]}, "completion", limits)
    # A token id counts as 4 characters: 10 ids fit in 40, 11 do not.
    parse_request({"model": "m", "prompt": [1] * 10}, "completion", limits)
    with pytest.raises(InvalidRequestError, match=r"has 11 token ids; the limit is 10"):
        parse_request({"model": "m", "prompt": [[1], [1] * 11]}, "completion", limits)
    with pytest.raises(InvalidRequestError, match="a list of 4 prompts; the limit is 3"):
        parse_request({"model": "m", "prompt": ["a"] * 4}, "completion", limits)
