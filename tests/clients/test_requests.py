"""Request building shared by both clients (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest

from fairq._requests import build_generate_request, build_metadata


def build(prompt: str | None = "hi", **overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "messages": None,
        "max_tokens": None,
        "temperature": None,
        "top_p": None,
        "stop": (),
        "seed": None,
        "ignore_eos": False,
        "tier": "",
        "request_id": "",
    }
    kwargs.update(overrides)
    return build_generate_request("m", prompt, **kwargs)


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
