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
