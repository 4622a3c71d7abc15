"""Large request bodies are parsed in slices: the same result and errors as json.loads, and
the event loop runs other work while a big body is parsed."""

from __future__ import annotations

import asyncio
import json

import pytest

from fairq_server.doors.http import json_body


def big_body() -> bytes:
    messages = [{"role": "user", "content": f"word {i} " * 3} for i in range(60_000)]
    tools = [{"a": [1, 2.5, None, True]}] * 1000
    nested = {"deep": {"x": [{"y": "z"}] * 10}}
    doc = {"model": "m", "messages": messages, "tools": tools, "nested": nested, "n": -1e3,
           "s": "\u2028\ud83d\ude00"}  # fmt: skip
    return json.dumps(doc).encode()


async def test_a_big_body_parses_as_json_loads_does_while_the_loop_runs() -> None:
    raw = big_body()
    assert len(raw) > 10 * json_body.SLICE_CHARS
    turns = 0
    stop = asyncio.Event()

    async def other_work() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    turns = 0
    parsed = await json_body.loads(raw)
    seen = turns
    stop.set()
    await task
    assert parsed == json.loads(raw)
    # One turn at least per slice: json.loads (the old parse) gives none.
    assert seen >= len(raw) // json_body.SLICE_CHARS - 1, seen


@pytest.mark.parametrize(
    "tail",
    [b"", b"  \n", b" x", b"}", b',"k"', b', "a": [1,]'],
)
async def test_a_big_body_fails_or_succeeds_as_json_loads_does(tail: bytes) -> None:
    raw = big_body()[:-1] + tail + b"}"
    try:
        expected: object = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):
            await json_body.loads(raw)
    else:
        assert await json_body.loads(raw) == expected


async def test_a_big_top_level_list_and_scalars() -> None:
    raw = json.dumps([{"i": i, "t": "x" * 50} for i in range(20_000)]).encode()
    assert await json_body.loads(raw) == json.loads(raw)
    raw = json.dumps("x" * 400_000).encode()
    assert await json_body.loads(raw) == json.loads(raw)
