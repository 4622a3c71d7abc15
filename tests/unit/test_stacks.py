"""The hang report of the test fixtures names the line each coroutine in a chain waits on."""

from __future__ import annotations

import asyncio

from ..stacks import task_stacks


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


async def test_task_stacks_follow_the_await_chain() -> None:
    gate = asyncio.Event()
    task = asyncio.create_task(_outer(gate), name="held")
    await asyncio.sleep(0)  # let it reach the gate
    report = task_stacks()
    gate.set()
    await task
    held = report.split("task held:\n", 1)[1].split("\ntask ", 1)[0]
    assert "in _outer" in held and "in _inner" in held and "in wait" in held
    assert "thread " in report
