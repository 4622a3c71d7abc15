"""OpenAI's defaults on the HTTP door, through the official openai SDK.

``n`` choices are served (each its own request, as vLLM runs them), a completions request
without ``max_tokens`` gets OpenAI's 16 tokens, a 400 names its field in ``param``, every
429 has one type, and ``GET /health`` answers load balancers and probes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from fairq_sim import SimServer

from ..conftest import FairqFactory
from .conftest import Door, start_door
from .test_door import post
from .test_prompt_lists import clients, outcomes

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Name three fair queueing algorithms."}
]


async def test_n_choices_are_served_each_as_its_own_request_seeded_as_vllm(door: Door) -> None:
    via, direct = clients(door)
    before = outcomes(door, "finished")
    reply = await via.completions.create(model="sim", prompt="Once", max_tokens=6, n=3, seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    # vLLM seeds choice j with seed + j: each choice is what that request gives alone.
    for j, choice in enumerate(reply.choices):
        alone = await direct.completions.create(
            model="sim", prompt="Once", max_tokens=6, seed=5 + j
        )
        assert choice.text == alone.choices[0].text and choice.text
    assert len({c.text for c in reply.choices}) == 3
    # Three requests went through the queue and the gate, each holding its own slot.
    assert outcomes(door, "finished") - before == 3
    # The prompt counts once, as vLLM counts it for n.
    single = await direct.completions.create(model="sim", prompt="Once", max_tokens=6, seed=5)
    assert reply.usage is not None and single.usage is not None
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens
    assert reply.usage.completion_tokens == 18
    assert reply.usage.total_tokens == single.usage.prompt_tokens + 18
    await via.close()
    await direct.close()


async def test_chat_n_choices_merged_and_streamed(door: Door) -> None:
    via, _ = clients(door)
    reply = await via.chat.completions.create(
        model="sim",
        messages=MESSAGES,
        max_tokens=5,
        n=2,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.message.content and c.message.role == "assistant" for c in reply.choices)
    assert reply.usage is not None and reply.usage.completion_tokens == 10
    stream = await via.chat.completions.create(
        model="sim",
        messages=MESSAGES,
        max_tokens=5,
        n=2,
        stream=True,
    )
    texts: dict[int, str] = {}
    ids = set()
    async for chunk in stream:
        ids.add(chunk.id)
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert sorted(texts) == [0, 1] and all(texts.values())
    assert len(ids) == 1  # one answer, one id
    await via.close()


async def test_n_above_its_limit_is_refused_naming_the_field(door: Door) -> None:
    via, _ = clients(door)
    with pytest.raises(openai.BadRequestError) as caught:
        await via.completions.create(model="sim", prompt="Once", max_tokens=4, n=17)
    assert caught.value.param == "n"
    assert "limits.max_choices" in caught.value.message
    await via.close()


async def test_completions_without_max_tokens_get_openai_default_of_16(door: Door) -> None:
    via, _ = clients(door)
    reply = await via.completions.create(model="sim", prompt="Once upon a time")
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    assert reply.choices[0].finish_reason == "length"
    await via.close()


@pytest.mark.parametrize(
    "kind,body,param",
    [
        ("chat", {"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ("chat", {"messages": MESSAGES, "temperature": 3}, "temperature"),
        ("chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("chat", {"messages": MESSAGES, "stop": 7}, "stop"),
        ("chat", {"messages": MESSAGES, "best_of": 3}, "best_of"),
        ("completions", {"prompt": ["a", 4]}, "prompt[1]"),
        ("completions", {"prompt": "x", "n_predict": 9}, "n_predict"),
        ("completions", {"prompt": "x", "model": ""}, "model"),
    ],
)
async def test_a_400_names_the_field_in_param(
    door: Door, kind: str, body: dict[str, Any], param: str
) -> None:
    path = "chat/completions" if kind == "chat" else "completions"
    status, _, doc = await post(f"{door.url}/v1/{path}", {"model": "sim", **body})
    assert status == 400, doc
    assert doc["error"]["param"] == param, doc


async def test_health_answers_200_while_serving_and_503_while_the_dispatcher_is_down(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim)
    dispatcher = door.server.core.dispatcher
    await dispatcher.sync()

    async def health() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"{door.url}/health") as r:
            return r.status, await r.json()

    assert await health() == (200, {"status": "serving"})
    # Restart the loop with a first delay, then crash it once (as the gRPC health test does).
    assert dispatcher._task is not None
    dispatcher._task.cancel()
    dispatcher.restart_delays = (2.0,)
    dispatcher.start()
    real = dispatcher._picker.dispatch
    faults = iter([RuntimeError("injected dispatcher fault")])

    def faulty(now: float, batch: int) -> bool:
        for fault in faults:
            raise fault
        return real(now, batch)

    dispatcher._picker.dispatch = faulty  # type: ignore[method-assign]
    dispatcher.wake()
    seen: list[int] = []

    async def status_is(wanted: int) -> None:
        async with asyncio.timeout(30):
            # Polling another server's state with a deadline: there is no event to await.
            while (await health())[0] != wanted:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        seen.append(wanted)

    await status_is(503)
    assert (await health())[1] == {"status": "not serving"}
    await status_is(200)
    assert seen == [503, 200] and dispatcher.crashes == 1


async def test_health_needs_no_key(keyed_door: Door) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{keyed_door.url}/health") as resp:
            assert resp.status == 200
        async with session.head(f"{keyed_door.url}/health") as resp:
            assert resp.status == 200
