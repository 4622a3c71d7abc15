"""Continuation requests per backend kind, the recorded progress, and the relay rewrite."""

from __future__ import annotations

import json

import pytest

from fairq_server.backends.base import Backend
from fairq_server.backends.continuation import (
    Progress,
    continue_openai,
    continue_tgi,
    exempt_reason,
    relay_payload,
    resumed_usage,
    short_of_room,
)
from fairq_server.backends.openai import OpenAIBackend
from fairq_server.backends.passthrough import RawDelta
from fairq_server.backends.request import BackendRequest, Resume, Sampling, TextDelta
from fairq_server.backends.tgi import TgiBackend
from fairq_server.backends.vllm import VllmBackend


def test_vllm_completions_continue_token_exact() -> None:
    backend = VllmBackend("v", "http://x", ["m"], preempt=True)
    request = BackendRequest(
        "m", prompt="Hi", sampling=Sampling(max_tokens=20, temperature=0.0), request_id="r1"
    )
    path, body = backend.payload(request, 0)
    assert body["return_token_ids"] is True
    resumed = BackendRequest(
        "m", prompt="Hi", sampling=Sampling(max_tokens=20), request_id="r1",
        resume=Resume(" there", 3, (1, 5, 7, 8, 9)),
    )  # fmt: skip
    path, body = backend.payload(resumed, 0)
    assert path == "/v1/completions"
    assert body["prompt"] == [1, 5, 7, 8, 9]
    assert body["max_tokens"] == 17
    assert body["request_id"] != "r1"  # the aborted attempt's id may still be in use


def test_without_ids_the_prompt_gets_the_text() -> None:
    backend = VllmBackend("v", "http://x", ["m"])
    _, body = backend.payload(BackendRequest("m", prompt="Hi", resume=Resume(" yo", 1)), 0)
    assert "return_token_ids" not in body
    assert body["prompt"] == "Hi yo"
    assert "max_tokens" not in body


def test_chat_continues_a_final_assistant_message() -> None:
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "q"}], "max_completion_tokens": 5,
        "min_tokens": 2,
    }  # fmt: skip
    continue_openai(body, Resume("partial", 3), token_ids=True)
    assert body["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "partial"},
    ]
    assert body["continue_final_message"] is True
    assert body["add_generation_prompt"] is False
    assert body["max_completion_tokens"] == 2
    assert body["min_tokens"] == 0


def test_tgi_generate_stream_continues_inputs() -> None:
    backend = TgiBackend("t", "http://x", ["m"])
    request = BackendRequest(
        "m", prompt="Hi", sampling=Sampling(max_tokens=10), resume=Resume(" a b", 2)
    )
    path, body = backend.payload(request)
    assert path == "/generate_stream"
    assert body["inputs"] == "Hi a b"
    assert body["parameters"]["max_new_tokens"] == 8
    plain: dict[str, object] = {"inputs": "x", "parameters": {}}
    continue_tgi(plain, Resume("y", 1))
    assert plain["inputs"] == "xy"


@pytest.mark.parametrize(
    ("request_", "adapter", "reason"),
    [
        (BackendRequest("m", prompt="x", sampling=Sampling(seed=1)), VllmBackend, "seed"),
        (BackendRequest("m", prompt="x", extra={"n": 2}), VllmBackend, "n"),
        (BackendRequest("m", prompt="x", sampling=Sampling(stop=("\n",))), VllmBackend, "stop"),
        (BackendRequest("m", prompt="x", extra={"logprobs": 1}), VllmBackend, "logprobs"),
        (
            BackendRequest("m", prompt="x", extra={"response_format": {}}),
            VllmBackend,
            "structured output",
        ),
        (BackendRequest("m", messages=(("user", "x"),)), TgiBackend, "chat not continued here"),
        (BackendRequest("m", messages=(("user", "x"),)), VllmBackend, None),
        (BackendRequest("m", prompt="x", extra={"n": 1, "logprobs": None}), VllmBackend, None),
    ],
)
def test_exempt(request_: BackendRequest, adapter: type[Backend], reason: str | None) -> None:
    assert exempt_reason(request_, continues_chat=adapter.continues_chat) == reason


def test_progress_keeps_ids_only_while_every_delta_has_them() -> None:
    p = Progress()
    p.record(TextDelta("a", 1, token_ids=(10,), prompt_token_ids=(1, 2)))
    p.record(TextDelta("b", 2, token_ids=(11, 12)))
    assert p.resume() == Resume("ab", 3, (1, 2, 10, 11, 12))
    p.record(TextDelta("c", 1))  # no ids: the continuation falls back to text
    assert p.resume() == Resume("abc", 4, None)


def test_progress_reads_relayed_chunks() -> None:
    p = Progress()
    chunks = (
        {"id": "c1", "created": 7, "choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"id": "c1", "created": 7, "choices": [{"delta": {"content": "hi"}}]},
    )
    p.record(RawDelta("...", 1, objects=chunks))
    assert p.resume() == Resume("hi", 1, None, "c1", 7)
    assert not p.beside_text
    p.record(RawDelta("...", 1, objects=({"choices": [{"delta": {"tool_calls": [{}]}}]},)))
    assert p.beside_text


def test_relay_rewrites_a_continuation_and_strips_ids() -> None:
    resume = Resume("hi", 2, None, "c1", 7)
    role = {"id": "c2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert relay_payload(role, json.dumps(role), resume, strip_ids=False) is None
    chunk = {"id": "c2", "created": 9, "choices": [{"text": "x", "token_ids": [5]}]}
    out = json.loads(relay_payload(chunk, json.dumps(chunk), resume, strip_ids=True) or "")
    assert out == {"id": "c1", "created": 7, "choices": [{"text": "x"}]}
    assert chunk["choices"][0]["token_ids"] == [5]  # the parsed chunk is left as read
    usage = {"id": "c2", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}}
    out = json.loads(relay_payload(usage, json.dumps(usage), resume, strip_ids=False) or "")
    assert out["usage"]["prompt_tokens"] == 10 and out["usage"]["completion_tokens"] == 5
    plain = {"id": "c1", "choices": [{"text": "y"}]}
    assert relay_payload(plain, "as-read", None, strip_ids=True) == "as-read"


def test_resumed_usage() -> None:
    assert resumed_usage(None, 10, 5) == (10, 5)
    assert resumed_usage(Resume("x", 4), 14, 6) == (10, 10)


def test_a_continuation_starts_where_the_sent_text_ends() -> None:
    # vLLM sends the ids of a character's first bytes with no text until it is complete;
    # a prompt ending in them makes it send the whole prompt's text as new output.
    p = Progress()
    p.record(TextDelta("a", 1, token_ids=(10,), prompt_token_ids=(1, 2)))
    p.record(TextDelta("", 1, token_ids=(11,)))
    assert p.resume() == Resume("a", 1, (1, 2, 10))
    # The continuation generates the character's bytes again: counted and sent once.
    p.record(TextDelta("é", 2, token_ids=(11, 12), prompt_token_ids=(1, 2, 10)))
    p.record(TextDelta("", 1, token_ids=(13,)))
    assert p.resume() == Resume("aé", 3, (1, 2, 10, 11, 12))
    assert p.tokens == 3
    relayed = Progress()
    chunk = {"id": "c", "choices": [{"text": "", "token_ids": [5], "prompt_token_ids": [1]}]}
    relayed.record(RawDelta("...", 0, objects=(chunk,)))
    assert relayed.resume() == Resume("", 0, (1,), "c", None)


def test_a_text_continuation_must_leave_room_for_its_output_to_tokenize_longer() -> None:
    # Found by a preemption run on the TGI-mode simulator: a victim near its end re-read 450
    # generated tokens as ~480 and TGI refused inputs + max_new_tokens over the context.
    request = BackendRequest("m", prompt="p" * 40, sampling=Sampling(max_tokens=450))
    text = Progress()
    text.record(TextDelta("x" * 880, 220))
    tgi = TgiBackend.continues_by_ids
    assert short_of_room(request, text, 512, prompt=10, by_ids=tgi)  # 10 + 450 + 56 > 512
    assert not short_of_room(request, text, 1024, prompt=10, by_ids=tgi)
    assert not short_of_room(request, text, None, prompt=10, by_ids=tgi)  # context unknown
    early = Progress()
    early.record(TextDelta("x" * 80, 20))
    assert not short_of_room(request, early, 512, prompt=10, by_ids=tgi)  # 10 + 450 + 6 fits
    # Token ids carry the exact count: only the request as sent has to fit.
    ids = Progress()
    ids.record(TextDelta("x" * 880, 220, token_ids=tuple(range(220)), prompt_token_ids=(1,)))
    vllm, openai = VllmBackend.continues_by_ids, OpenAIBackend.continues_by_ids
    assert not short_of_room(request, ids, 512, prompt=10, by_ids=vllm)
    assert short_of_room(request, ids, 512, prompt=10, by_ids=openai)  # sent as text there
    chat = BackendRequest("m", messages=(("user", "hi"),), sampling=Sampling(max_tokens=450))
    assert short_of_room(chat, ids, 512, prompt=10, by_ids=vllm)  # chat continues by text
