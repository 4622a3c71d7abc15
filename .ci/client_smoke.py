"""The installed fairq-client wheel against a running fairq (run from a clean virtualenv).

Usage: ``python client_smoke.py TARGET SIM_URL`` with ``FAIRQ_API_KEY`` an admin key.
Exercises every public call of the sync and async clients once, and checks that nothing of
the server came along with the client.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys

import fairq


def main() -> None:
    """Run the checks; an AssertionError or FairqError fails the step."""
    target, sim_url = sys.argv[1], sys.argv[2]
    key = os.environ["FAIRQ_API_KEY"]
    for module in ("fairq_server", "matplotlib", "starlette", "uvicorn", "aiohttp"):
        assert importlib.util.find_spec(module) is None, f"{module} came with the client"
    with fairq.Client(target, api_key=key) as client:
        status = client.register_backend("sim-b", "vllm", sim_url, ["sim"])
        assert status.healthy, status
        assert sorted(b.backend.id for b in client.list_backends()) == ["sim-a", "sim-b"]
        done = client.complete(
            "sim", "Hello from the wheel", max_tokens=8, tier="batch", ignore_eos=True
        )
        assert done.completion_tokens == 8 and done.text, done
        snap = client.queue_snapshot()
        assert snap.models[0].model == "sim"
        assert [u.user for u in snap.users] == ["ci-admin"]
        client.deregister_backend("sim-b", drain=True)
        assert [b.backend.id for b in client.list_backends()] == ["sim-a"]
        try:
            client.complete("no-such-model", "x", max_tokens=1)
        except fairq.NotFoundError as exc:
            assert "no-such-model" in exc.message
        else:
            raise AssertionError("NOT_FOUND expected")

    async def stream() -> list[fairq.Event]:
        async with fairq.AsyncClient(target, api_key=key) as client:
            events = client.generate("sim", "async", max_tokens=4, ignore_eos=True)
            return [e async for e in events]

    events = asyncio.run(stream())
    assert isinstance(events[-1], fairq.Finished) and events[-1].completion_tokens == 4
    print(f"fairq-client on Python {sys.version.split()[0]}: every call OK")


if __name__ == "__main__":
    main()
