"""What the HTTP door answers: a non-streamed answer is bounded (the backend request aborted
beyond the bound), and text generated before a backend fails reaches the caller."""

from __future__ import annotations

from fairq_sim import SimServer

from ..conftest import FairqFactory
from .conftest import start_door
from .test_door import CHAT, assert_openai_error, post, until


async def test_an_oversized_non_streamed_answer_is_refused_and_aborted(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim, max_answer_chars=3000)
    url = f"{door.url}/v1/chat/completions"
    status, _, doc = await post(url, CHAT)  # a short answer is within the bound
    assert status == 200 and doc["choices"][0]["message"]["content"]
    sim.config.speed = 0.5  # 500 tokens take far longer than the test
    status, _, doc = await post(url, {**CHAT, "max_tokens": 500})
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", "larger than 3000 characters")
    assert doc["error"]["code"] == "answer_too_large"
    await until(lambda: sim.engine.running_count == 0)


async def test_request_id_follows_the_grpc_rule_and_comes_back_as_a_header(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim)
    url = f"{door.url}/v1/chat/completions"
    for bad in ("a\nb", 'a"b', "a\u2028b", "", "x" * 129, 7):
        status, _, doc = await post(url, {**CHAT, "request_id": bad})
        assert status == 400, bad
        assert "request_id" in doc["error"]["message"], doc
    status, headers, doc = await post(url, {**CHAT, "request_id": "job-1:a/b"})
    assert status == 200 and headers["X-Request-ID"] == "job-1:a/b"
    status, headers, _ = await post(url, {**CHAT, "stream": True})
    assert status == 200 and len(headers["X-Request-ID"]) == 32  # fairq's own id
