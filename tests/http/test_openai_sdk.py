"""The official openai SDK (sync and async) through fairq's HTTP door and directly.

The simulator generates text from the request's seed, so the same request gives the same
answer directly and through fairq: any difference is something fairq changed.
"""

from __future__ import annotations

import asyncio
import json

import openai

from .conftest import Door

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is fair queueing?"}]


def clients(door: Door) -> tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]:
    via = openai.AsyncOpenAI(base_url=f"{door.url}/v1", api_key="unused", max_retries=0)
    direct = openai.AsyncOpenAI(base_url=f"{door.sim.url}/v1", api_key="unused", max_retries=0)
    return via, direct


async def test_chat_non_streaming_same_as_direct(door: Door) -> None:
    via, direct = clients(door)
    kw = {"model": "sim", "messages": MESSAGES, "max_tokens": 12, "seed": 7}
    a = await via.chat.completions.create(**kw)  # type: ignore[call-overload]
    b = await direct.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content
    assert a.choices[0].finish_reason == b.choices[0].finish_reason == "length"
    assert a.usage == b.usage
    assert a.model == "sim" and a.object == "chat.completion"
    await via.close()
    await direct.close()


async def test_chat_streaming_same_as_direct(door: Door) -> None:
    via, direct = clients(door)
    kw = {"model": "sim", "messages": MESSAGES, "max_tokens": 12, "seed": 3, "stream": True,
          "stream_options": {"include_usage": True}}  # fmt: skip

    async def collect(client: openai.AsyncOpenAI) -> tuple[str, object, list[str | None]]:
        stream = await client.chat.completions.create(**kw)  # type: ignore[call-overload]
        text, usage, reasons = "", None, []
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                reasons.append(c.finish_reason)
        return text, usage, reasons

    a, b = await collect(via), await collect(direct)
    assert a[0] == b[0] and a[0]
    assert a[1] == b[1]
    assert a[2][-1] == b[2][-1] == "length"
    await via.close()
    await direct.close()


async def test_usage_chunk_only_when_asked(door: Door) -> None:
    via, _ = clients(door)
    stream = await via.chat.completions.create(
        model="sim",
        messages=MESSAGES,
        max_tokens=4,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = [c async for c in stream]
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


async def test_completions_both_ways(door: Door) -> None:
    via, direct = clients(door)
    kw = {"model": "sim", "prompt": "Once upon a time", "max_tokens": 10, "seed": 5}
    a = await via.completions.create(**kw)  # type: ignore[call-overload]
    b = await direct.completions.create(**kw)  # type: ignore[call-overload]
    assert a.choices[0].text == b.choices[0].text and a.choices[0].text
    assert a.usage == b.usage
    stream = await via.completions.create(stream=True, **kw)  # type: ignore[call-overload]
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == b.choices[0].text
    await via.close()
    await direct.close()


async def test_tool_call_same_as_direct(door: Door) -> None:
    via, direct = clients(door)
    kw = {"model": "sim", "messages": MESSAGES, "max_tokens": 8, "seed": 11, "tools": TOOLS,
          "tool_choice": {"type": "function", "function": {"name": "lookup"}}}  # fmt: skip
    a = await via.chat.completions.create(**kw)  # type: ignore[call-overload]
    b = await direct.chat.completions.create(**kw)  # type: ignore[call-overload]
    call_a, call_b = a.choices[0].message.tool_calls[0], b.choices[0].message.tool_calls[0]
    assert call_a.function.name == call_b.function.name == "lookup"
    assert json.loads(call_a.function.arguments) == json.loads(call_b.function.arguments)
    assert call_a.id and call_a.type == "function"
    # Streamed: the argument pieces assemble into the same call.
    stream = await via.chat.completions.create(stream=True, **kw)  # type: ignore[call-overload]
    pieces = [
        tc.function.arguments or ""
        async for chunk in stream
        for c in chunk.choices
        for tc in c.delta.tool_calls or ()
        if tc.function
    ]
    assert json.loads("".join(pieces)) == json.loads(call_b.function.arguments)
    await via.close()
    await direct.close()


async def test_sync_client(door: Door) -> None:
    via = openai.OpenAI(base_url=f"{door.url}/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=f"{door.sim.url}/v1", api_key="unused", max_retries=0)

    def run() -> None:
        kw = {"model": "sim", "messages": MESSAGES, "max_tokens": 6, "seed": 2}
        a = via.chat.completions.create(**kw)  # type: ignore[call-overload]
        b = direct.chat.completions.create(**kw)  # type: ignore[call-overload]
        assert a.choices[0].message.content == b.choices[0].message.content
        text = "".join(
            c.choices[0].delta.content or ""
            for c in via.chat.completions.create(stream=True, **kw)  # type: ignore[call-overload]
            if c.choices
        )
        assert text == b.choices[0].message.content
        models = via.models.list()
        assert [m.id for m in models.data] == ["sim"]

    # The sync client blocks: it runs in a thread while the event loop serves fairq.
    await asyncio.to_thread(run)
