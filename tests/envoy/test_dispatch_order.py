"""Dispatch order through Envoy is the HTTP door's: one queue, one fairness, whichever door.

One engine slot (``max_in_flight = 1``) held by a long stream while a backlog queues: user a
sends four requests, then b and c one each. When the slot frees, the requests run one at a
time, so the order they finish in is the order fairq dispatched them. The same arrivals through
the HTTP door and through Envoy give the same order (and not arrival order: b and c go before
a's backlog).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from fairq_bench.envoy_process import EnvoyProcess
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from ..http.test_door import CHAT, until
from .conftest import start_envoy, with_extproc

ARRIVALS = ("a", "a", "a", "a", "b", "c")


async def dispatch_order(base: str, core: object) -> list[str]:
    finished: list[str] = []

    async def one(session: aiohttp.ClientSession, user: str) -> None:
        body = {**CHAT, "max_tokens": 8, "user": user}
        async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
        finished.append(user)

    async with aiohttp.ClientSession() as session:
        hold = await session.post(
            f"{base}/v1/chat/completions",
            json={**CHAT, "stream": True, "max_tokens": 400, "user": "holder"},
        )
        await hold.content.readuntil(b"\n\n")
        tasks = []
        for i, user in enumerate(ARRIVALS):
            tasks.append(asyncio.create_task(one(session, user)))
            # Arrival order is the list's: each is queued before the next is sent.
            await until(lambda n=i: core.live_requests() == n + 2)  # type: ignore[attr-defined]
        hold.close()  # the slot frees; the queue drains one request at a time
        await asyncio.gather(*tasks)
    await until(lambda: core.live_requests() == 0)  # type: ignore[attr-defined]
    return finished


async def test_envoy_dispatches_in_the_http_doors_order(
    fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> None:
    orders = {}
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=1.0, max_num_seqs=4)) as sim:
        for door in ("http", "envoy"):
            config = with_extproc(make_config([sim_backend(sim, max_in_flight=1)]))
            server = await fairq_factory(config)
            base = f"http://127.0.0.1:{server.http_port}"
            if door == "envoy":
                envoy = await start_envoy([("fairq", config.extproc.listen)])
                envoys.append(envoy)
                base = envoy.url
            started = time.monotonic()
            orders[door] = await dispatch_order(base, server.core)
            print(f"{door}: {orders[door]} ({time.monotonic() - started:.1f} s)")
    assert orders["envoy"] == orders["http"]
    assert orders["http"] != list(ARRIVALS)  # fairness reordered the backlog
    assert orders["http"].index("b") < orders["http"].index("a", 2)
