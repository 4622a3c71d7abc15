"""vLLM mode over real HTTP on loopback: shapes as in the recorded fixtures."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fairq_sim import SimConfig, SimServer

from .helpers import wait_until

FIXTURES = Path(__file__).parent.parent / "fixtures"
FAST = SimConfig(model="tiny", speed=50.0)


def sse_events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]


def fixture_events(name: str) -> list[Any]:
    raw = sse_events((FIXTURES / name).read_text())
    return [json.loads(e) if e != "[DONE]" else e for e in raw]


def shape(obj: Any) -> Any:
    """Keys (in order) and value types, recursively: what a parser can observe."""
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    return type(obj).__name__


async def test_completion_stream_matches_recorded_shape() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {
            "model": "tiny",
            "prompt": "Hello",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        resp = await client.post("/v1/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = [json.loads(e) if e != "[DONE]" else e for e in sse_events(resp.text)]
    recorded = fixture_events("completions-stream.sse")
    assert len(events) == len(recorded) == 6
    assert events[-1] == "[DONE]"
    for got, want in zip(events[:-1], recorded[:-1], strict=True):
        assert shape(got) == shape(want)
    assert [e["choices"][0]["finish_reason"] for e in events[:4]] == [None, None, None, "length"]
    assert events[4]["usage"] == {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4}
    assert events[0]["id"].startswith("cmpl-") and len({e["id"] for e in events[:-1]}) == 1


async def test_chat_stream_matches_recorded_shape() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hi there"}],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        resp = await client.post("/v1/chat/completions", json=body)
    events = [json.loads(e) if e != "[DONE]" else e for e in sse_events(resp.text)]
    recorded = fixture_events("chat-stream.sse")
    assert len(events) == len(recorded) == 7
    for got, want in zip(events[:-1], recorded[:-1], strict=True):
        assert shape(got) == shape(want)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[4]["choices"][0]["finish_reason"] == "length"
    assert events[5]["choices"] == [] and events[5]["usage"]["completion_tokens"] == 4
    assert events[0]["id"].startswith("chatcmpl-")


async def test_non_streaming_completion_matches_recorded_shape() -> None:
    recorded = json.loads(
        (FIXTURES / "error-priority-on-fcfs-server.txt").read_text().split("\n")[0]
    )
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        resp = await client.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "Hi", "max_tokens": 4, "priority": 5},
        )
        chat = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 3},
        )
    assert resp.status_code == 200
    assert shape(resp.json()) == shape(recorded)
    assert resp.json()["usage"]["completion_tokens"] == 4
    message = chat.json()["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    assert chat.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("fixture", "path", "body"),
    [
        ("error-unknown-model.txt", "/v1/completions", {"model": "nope", "prompt": "x"}),
        (
            "error-too-long.txt",
            "/v1/completions",
            {"model": "tiny", "prompt": "x", "max_tokens": 100000},
        ),
    ],
)
async def test_errors_match_recorded_bodies(fixture: str, path: str, body: dict[str, Any]) -> None:
    text, status_line = (FIXTURES / fixture).read_text().strip().split("\n")
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        resp = await client.post(path, json=body)
    assert f"HTTP {resp.status_code}" == status_line
    assert resp.json() == json.loads(text)


async def test_bad_requests_are_400_in_nested_shape() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        options = await client.post(
            "/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": True}}
        )
        long_prompt = await client.post("/v1/completions", json={"prompt": "x" * 4000})
        not_json = await client.post(
            "/v1/completions", content=b"{", headers={"content-type": "application/json"}
        )
    error = options.json()["error"]
    assert options.status_code == 400
    assert error["type"] == "BadRequestError" and error["param"] == "stream_options"
    assert "stream=True" in error["message"] and error["code"] == 400
    assert long_prompt.status_code == 400
    assert "maximum context length is 512" in long_prompt.json()["error"]["message"]
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == 400


async def test_max_tokens_is_capped_by_remaining_context() -> None:
    prompt = "y" * 4 * 500  # 501 tokens with BOS; 11 left of 512
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        resp = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 100})
    assert resp.json()["usage"]["completion_tokens"] == 11
    assert resp.json()["choices"][0]["finish_reason"] == "length"


async def test_models_health_version() -> None:
    recorded = json.loads((FIXTURES / "models.json").read_text())
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        models = await client.get("/v1/models")
        health = await client.get("/health")
        version = await client.get("/version")
    assert shape(models.json()) == shape(recorded)
    assert models.json()["data"][0]["id"] == "tiny"
    assert models.json()["data"][0]["max_model_len"] == 512
    assert health.status_code == 200 and health.content == b""
    assert version.json() == {"version": "0.32.0"}


async def test_stop_string_cut_from_text_and_reported() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        first = await client.post(
            "/v1/completions", json={"prompt": "a", "max_tokens": 8, "seed": 1}
        )
        text = first.json()["choices"][0]["text"]
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        body = {"prompt": "a", "max_tokens": 8, "seed": 1, "stop": [stop]}
        resp = await client.post("/v1/completions", json=body)
        streamed = await client.post("/v1/completions", json=body | {"stream": True})
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == text[: text.index(stop)]
    chunks = [json.loads(e) for e in sse_events(streamed.text) if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert chunks[-1]["choices"][0]["stop_reason"] == stop


async def test_x_request_id_names_the_response() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        resp = await client.post(
            "/v1/completions",
            json={"prompt": "a", "max_tokens": 1, "request_id": "body-id"},
            headers={"X-Request-Id": "hdr-id"},
        )
    assert resp.json()["id"] == "cmpl-hdr-id"


async def test_priority_mode_serves_lower_value_first() -> None:
    config = SimConfig(speed=5.0, max_num_seqs=1, priority_mode=True)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        async with client.stream(
            "POST", "/v1/completions", json={"prompt": "block", "max_tokens": 200, "stream": True}
        ) as blocker:
            lines = blocker.aiter_lines()
            await anext(lines)  # the blocker holds the only slot
            finished: list[str] = []
            low = asyncio.create_task(
                client.post(
                    "/v1/completions", json={"prompt": "low", "max_tokens": 1, "priority": 9}
                )
            )
            low.add_done_callback(lambda _: finished.append("low"))
            await wait_until(lambda: sim.engine.waiting_count == 1)
            high = asyncio.create_task(
                client.post(
                    "/v1/completions", json={"prompt": "high", "max_tokens": 1, "priority": -1}
                )
            )
            high.add_done_callback(lambda _: finished.append("high"))
            await wait_until(lambda: sim.engine.waiting_count == 2)
            assert [r.priority for r in sim.engine.waiting] == [-1, 9]
            async for _ in lines:
                pass
        done_low, done_high = await low, await high
    assert done_low.status_code == done_high.status_code == 200
    assert finished == ["high", "low"]


async def test_stream_disconnect_aborts_engine_request() -> None:
    config = SimConfig(speed=1.0)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        body = {"prompt": "long", "max_tokens": 400, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.aiter_lines()
            first = await anext(lines)
            assert first.startswith("data: ")
        await wait_until(lambda: sim.engine.running_count == 0)
        metrics = (await client.get("/metrics")).text
    assert (
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="sim"} 1.0'
        in metrics
    )
    assert sim.engine.kv.usage == 0.0


async def test_queued_non_streaming_request_aborted_on_disconnect() -> None:
    config = SimConfig(speed=1.0, max_num_seqs=1)
    async with SimServer(config) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        blocker = asyncio.create_task(
            client.post("/v1/completions", json={"prompt": "b", "max_tokens": 300})
        )
        await wait_until(lambda: sim.engine.running_count == 1)
        waiter = asyncio.create_task(
            client.post("/v1/completions", json={"prompt": "w", "max_tokens": 5})
        )
        await wait_until(lambda: sim.engine.waiting_count == 1)
        waiter.cancel()  # closes the connection
        await wait_until(lambda: sim.engine.waiting_count == 0)
        assert sim.engine.running_count == 1  # the blocker is untouched
        blocker.cancel()
        await wait_until(lambda: sim.engine.running_count == 0)


async def test_unknown_route_and_method_as_fastapi_answers() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        missing = await client.get("/v2/nothing")
        wrong = await client.get("/v1/completions")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})


async def test_a_list_of_prompts_gets_a_choice_per_prompt_as_vllm_answers() -> None:
    prompts = ["Hello", [5, 6, 7, 8], "A longer prompt here"]
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        base = {"model": "tiny", "max_tokens": 4, "seed": 3}
        singles = [
            (await client.post("/v1/completions", json={**base, "prompt": p})).json()
            for p in prompts
        ]
        joined = (await client.post("/v1/completions", json={**base, "prompt": prompts})).json()
        body = {**base, "prompt": prompts, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        streamed = await client.post("/v1/completions", json=body)
    assert [c["index"] for c in joined["choices"]] == [0, 1, 2]
    assert [c["text"] for c in joined["choices"]] == [s["choices"][0]["text"] for s in singles]
    assert joined["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert joined["usage"]["total_tokens"] == sum(s["usage"]["total_tokens"] for s in singles)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    texts = ["", "", ""]
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == [c["text"] for c in joined["choices"]]
    assert len({c["id"] for c in chunks}) == 1
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert chunks[-1]["choices"] == []
    assert {k: chunks[-1]["usage"][k] for k in counts} == {k: joined["usage"][k] for k in counts}


async def test_a_list_of_prompts_with_a_bad_one_is_refused() -> None:
    async with SimServer(FAST) as sim, httpx.AsyncClient(base_url=sim.url) as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": ["a", 3]})
    assert resp.status_code == 400
