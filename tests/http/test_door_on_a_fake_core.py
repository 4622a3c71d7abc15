"""The HTTP door over a fake core: a door needs nothing of the core but its port.

The fake implements :class:`~fairq_server.port.CorePort` and answers each ticket from a
script; the door runs for real on a loopback port and is called over HTTP. What is checked is
the door's own work: authentication, parsing, the answer's shape, refusals and cancellation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from fairq_server.backends.request import BackendRequest, StreamEnd
from fairq_server.config.identity import KeyConfig
from fairq_server.config.schema import BackendConfig, Config
from fairq_server.doors.http.server import HttpDoor
from fairq_server.errors import QuotaExceededError, SchedulerError
from fairq_server.identity.api_keys import hash_key
from fairq_server.identity.auth import Authenticator
from fairq_server.port import CorePort, Submission, Submitted
from fairq_server.runtime.loop_tools import LoopTools
from fairq_server.scheduling.outbox import Finished, Outbox, Queued, Started
from fairq_server.scheduling.queue_view import BackendView, QueueView
from fairq_server.telemetry import Telemetry

KEY = "fake-core-key"


@dataclass
class FakeTicket:
    """What the fake hands back for a submitted request."""

    request: BackendRequest
    tier: int
    outbox: Outbox


class FakeCore:
    """A core that answers every ticket with ``reply`` (or never, when ``reply`` is None)."""

    def __init__(self, reply: str | None = "hello there") -> None:
        self.config = Config()
        self.tier_names = tuple(t.name for t in self.config.tiers)
        self.telemetry = Telemetry()
        self.tools = LoopTools()
        self.reply = reply
        self.refuse: SchedulerError | None = None
        self.submitted: list[Submission] = []
        self.cancelled: list[str] = []
        self.cancel_seen = asyncio.Event()

    def served_models(self) -> set[str]:
        return {"m"}

    def known_models(self) -> set[str]:
        return {"m"}

    def refusal(self, user: str, team: str | None, model: str) -> SchedulerError | None:
        return self.refuse

    def token_prompt_refusers(self, model: str) -> list[str]:
        return []

    def submit(self, submission: Submission) -> Submitted:
        self.submitted.append(submission)
        ticket = FakeTicket(submission.request, submission.tier, Outbox(relay=True))
        if self.reply is None:
            ticket.outbox.put(Queued(position=0))
            return ticket
        outbox, tier = ticket.outbox, self.tier_names[ticket.tier]
        outbox.put(Started("fake", 0.0, tier))
        # The HTTP door relays the backend's own chunks: the fake is an OpenAI-style backend.
        chunk = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": self.reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
        outbox.put_text(f"data: {json.dumps(chunk)}\n\n")
        outbox.put(Finished(StreamEnd("stop", 3, 2), 3, 2, 0.0, 0.0, 0.0))
        return ticket

    def cancel(self, submitted: Submitted) -> None:
        assert isinstance(submitted, FakeTicket)
        self.cancelled.append(submitted.request.request_id)
        self.cancel_seen.set()

    def backend_views(self) -> list[BackendView]:
        return []

    async def register_remote(self, cfg: BackendConfig) -> BackendView:
        raise AssertionError("the HTTP door registers no backend")

    async def deregister_backend(self, backend_id: str, *, drain: bool) -> bool:
        raise AssertionError("the HTTP door removes no backend")

    def queue_view(self) -> QueueView:
        return QueueView(tiers=self.tier_names)


@pytest.fixture
async def door() -> AsyncIterator[tuple[FakeCore, str]]:
    core = FakeCore()
    port: CorePort = core  # the fake is a port: mypy checks it against the protocol
    auth = Authenticator([KeyConfig("alice", hash_key(KEY))], core.tier_names)
    server = HttpDoor(port, auth, "127.0.0.1:0")
    await server.start()
    try:
        yield core, f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


async def test_an_answer_comes_from_the_core_the_door_is_given(
    door: tuple[FakeCore, str],
) -> None:
    core, url = door
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as resp,
    ):
        answer = await resp.json()
    assert resp.status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "hello there"
    assert answer["usage"]["completion_tokens"] == 2
    assert [(t.user, t.request.model, t.max_tokens) for t in core.submitted] == [("alice", "m", 5)]


async def test_a_refusal_of_the_core_is_a_429_with_its_retry_hint(
    door: tuple[FakeCore, str],
) -> None:
    core, url = door
    core.refuse = QuotaExceededError("tokens_per_minute reached", retry_after=7.0, limit="tpm")
    body = {"model": "m", "prompt": "hi", "max_tokens": 5}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as resp,
    ):
        answer = await resp.json()
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "7"
    assert "tokens_per_minute" in answer["error"]["message"]
    assert core.submitted == []


async def test_a_caller_who_goes_away_cancels_its_ticket(door: tuple[FakeCore, str]) -> None:
    core, url = door
    core.reply = None  # the request stays queued
    body = {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": True}
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {KEY}", "x-fairq-queue-events": "1"}
        resp = await session.post(f"{url}/v1/completions", json=body, headers=headers)
        assert resp.status == 200
        assert (await resp.content.readline()).startswith(b": fairq queued")  # it is queued
        resp.close()
    await asyncio.wait_for(core.cancel_seen.wait(), timeout=30)
    assert core.cancelled == [s.request.request_id for s in core.submitted]
