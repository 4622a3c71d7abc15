"""Pass-through parameters (``extra=``) reaching a real backend through a real fairq.

fairq runs in process in front of the simulator in vLLM mode, which honours a
forced ``tool_choice``: it answers with one call of the named function, its
arguments streamed piece by piece in ``tool_calls`` deltas, as vLLM does. A
tool call can only come back if ``tools`` and ``tool_choice`` reached the
backend.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

import fairq

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "emit",
            "description": "Emit the answer.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
]
FORCED = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "emit"}}}
MESSAGES = [{"role": "user", "content": "hello"}]


def tool_calls(extras: tuple[Mapping[str, Any], ...]) -> list[dict[str, Any]]:
    """Every tool-call delta in the chunks' extras, in order."""
    choices = [choice for extra in extras for choice in extra["choices"]]
    return [call for choice in choices for call in choice.get("delta", {}).get("tool_calls", [])]


def arguments(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The forced call's arguments, joined from its pieces and parsed."""
    parsed: dict[str, Any] = json.loads("".join(c["function"]["arguments"] for c in calls))
    return parsed


async def test_async_complete_passes_tools_through(fairq_target: str, sim_model: str) -> None:
    async with fairq.AsyncClient(fairq_target, user="alice") as client:
        completion = await client.complete(sim_model, messages=MESSAGES, max_tokens=6, extra=FORCED)
    calls = tool_calls(completion.extras)
    assert calls[0]["function"]["name"] == "emit"
    assert calls[0]["index"] == 0  # an int again, not the Struct's 0.0
    assert set(arguments(calls)) == {"text"}
    assert completion.text == ""  # the output went into the call, not the text
    assert completion.completion_tokens == 6


async def test_sync_generate_passes_tools_through(fairq_target: str, sim_model: str) -> None:
    def run() -> list[fairq.Event]:
        with fairq.Client(fairq_target, user="bob") as client:
            return list(client.generate(sim_model, messages=MESSAGES, max_tokens=4, extra=FORCED))

    # The blocking client runs in a thread: this loop serves fairq meanwhile.
    events = await asyncio.to_thread(run)
    extras = tuple(e.extra for e in events if isinstance(e, fairq.Chunk) and e.extra)
    calls = tool_calls(extras)
    assert calls[0]["function"]["name"] == "emit"
    assert set(arguments(calls)) == {"text"}
    assert isinstance(events[-1], fairq.Finished)


async def test_a_backend_refusing_a_passed_parameter_is_an_invalid_argument(
    fairq_target: str, sim_model: str
) -> None:
    # The backend, not fairq, knows that the forced function is missing from tools.
    bad = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "absent"}}}
    async with fairq.AsyncClient(fairq_target, user="alice") as client:
        with pytest.raises(fairq.InvalidArgumentError, match="absent"):
            await client.complete(sim_model, messages=MESSAGES, max_tokens=4, extra=bad)


async def test_a_key_fairq_sets_itself_is_refused(fairq_target: str, sim_model: str) -> None:
    async with fairq.AsyncClient(fairq_target, user="alice") as client:
        with pytest.raises(fairq.InvalidArgumentError, match="priority"):
            await client.complete(sim_model, "hi", max_tokens=4, extra={"priority": -100})
