"""Request building shared by both clients (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest

from fairq import _calls
from fairq._requests import build_metadata


def build(prompt: str | None = "hi", **overrides: Any) -> Any:
    return _calls.generate("m", prompt, **overrides).request


def test_prompt_request_leaves_unset_sampling_fields_unset() -> None:
    request = build()
    assert request.WhichOneof("input") == "prompt"
    assert request.prompt == "hi"
    for name in ("max_tokens", "temperature", "top_p", "seed"):
        assert not request.sampling.HasField(name), name


def test_zero_values_are_sent_when_given() -> None:
    # 0 is a meaningful temperature (greedy); it must not read as "unset".
    request = build(temperature=0.0, seed=0, max_tokens=1)
    assert request.sampling.HasField("temperature")
    assert request.sampling.temperature == 0.0
    assert request.sampling.HasField("seed")


def test_empty_prompt_is_still_a_prompt() -> None:
    assert build("").WhichOneof("input") == "prompt"


def test_token_ids_select_the_token_input() -> None:
    request = _calls.generate("m", [101, 7, 0]).request
    assert request.WhichOneof("input") == "prompt_token_ids"
    assert list(request.prompt_token_ids.ids) == [101, 7, 0]


def test_messages_accept_pairs_and_mappings() -> None:
    request = build(None, messages=[("system", "s"), {"role": "user", "content": "u"}])
    assert [(m.role, m.content) for m in request.messages.messages] == [
        ("system", "s"),
        ("user", "u"),
    ]


def test_empty_messages_still_select_the_messages_input() -> None:
    # The server, not the client, reports an empty conversation.
    assert build(None, messages=[]).WhichOneof("input") == "messages"


@pytest.mark.parametrize(
    ("prompt", "messages"), [(None, None), ("hi", [("user", "hi")])], ids=["neither", "both"]
)
def test_exactly_one_input(prompt: str | None, messages: Any) -> None:
    with pytest.raises(ValueError, match="exactly one of prompt or messages"):
        build(prompt, messages=messages)


def test_message_mapping_without_content() -> None:
    with pytest.raises(ValueError, match=r"messages\[0\] has no 'content' key"):
        build(None, messages=[{"role": "user"}])


def test_plain_string_stop_is_rejected() -> None:
    with pytest.raises(TypeError, match="stop must be a sequence"):
        build(stop="\n")


def test_plain_string_messages_are_rejected() -> None:
    with pytest.raises(TypeError, match="messages must be a sequence"):
        build(None, messages="hello")


def test_metadata() -> None:
    assert build_metadata(None, None) == ()
    assert build_metadata("k", "alice") == (
        ("authorization", "Bearer k"),
        ("x-fairq-user", "alice"),
    )
    assert build_metadata(None, "alice") == (("x-fairq-user", "alice"),)


def test_extra_is_sent_as_a_struct() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    request = build(extra={"tools": tools, "top_k": 5, "logprobs": True, "x": None})
    assert request.HasField("extra")
    sent = request.extra
    assert sent["tools"][0]["function"]["name"] == "f"
    assert (sent["top_k"], sent["logprobs"], sent["x"]) == (5, True, None)


def test_no_extra_leaves_the_field_unset() -> None:
    assert not build().HasField("extra")
    # An empty mapping is sent as given (the server treats it as none).
    assert build(extra={}).HasField("extra")


@pytest.mark.parametrize(
    ("extra", "error", "match"),
    [
        ("tools", TypeError, "extra must be a mapping"),
        ({1: "a"}, TypeError, "extra has a key 1 that is not a str"),
        ({"a": {"b": [1, object()]}}, TypeError, r"extra\['a'\]\['b'\]\[1\] is a object"),
        ({"a": b"x"}, TypeError, r"extra\['a'\] is a bytes"),
        ({"seed_like": 2**60}, ValueError, r"extra\['seed_like'\] = \d+ is beyond 2\*\*53"),
        ({"t": float("nan")}, ValueError, "not a finite number"),
    ],
)
def test_bad_extra_is_refused_before_any_call(
    extra: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        build(extra=extra)
