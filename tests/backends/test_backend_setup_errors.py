"""What an operator sees of a backend that is set up wrong: unreachable, or not serving a model.

An unreachable backend is logged in one line naming where fairq tried to go and what the
system said, not aiohttp's nested repr; a model no backend serves is not offered by
``GET /v1/models``. (A ``base_url`` ending in ``/v1`` is refused at load:
``tests/unit/test_config.py``.)
"""

from __future__ import annotations

import logging
import socket
from dataclasses import replace

import openai
import pytest

from fairq_server.config.schema import BackendConfig, HttpConfig
from fairq_server.scheduling.backend_state import Health
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from ..http.test_door import until


def closed_port() -> int:
    """Return a loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_an_unreachable_backend_is_logged_in_one_line_with_url_and_reason(
    fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    port = closed_port()
    backend = BackendConfig("gone", "vllm", f"http://127.0.0.1:{port}", ("m",))
    caplog.set_level(logging.WARNING)
    server = await fairq_factory(make_config([backend]))
    state = server.core.backend("gone")
    assert state is not None
    await until(lambda: state.health is Health.DOWN, timeout=30)
    lines = [r.getMessage() for r in caplog.records if "gone" in r.getMessage()]
    assert lines, caplog.text
    expected = (
        f"cannot list models at http://127.0.0.1:{port}/v1/models: "
        f"cannot connect to 127.0.0.1:{port}: Connection refused"
    )
    assert any(expected in line for line in lines), lines
    assert expected in state.reason  # what Admin, fairq top and the console show
    for line in lines:
        assert "\n" not in line and "ConnectionKey(" not in line and "Error(" not in line


async def test_models_lists_only_models_a_backend_serves(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    # "ghost" is registered on a backend whose /v1/models does not list it, "far" on one
    # that cannot be reached: neither is served, so neither is offered.
    ghost = BackendConfig("ghost-b", "vllm", sim.url, ("ghost",))
    far = BackendConfig("far-b", "vllm", f"http://127.0.0.1:{closed_port()}", ("far",))
    config = make_config([sim_backend(sim), ghost, far])
    server = await fairq_factory(replace(config, http=HttpConfig(listen="127.0.0.1:0")))
    for backend_id in ("ghost-b", "far-b"):
        state = server.core.backend(backend_id)
        assert state is not None
        await until(lambda s=state: s.health is Health.DOWN, timeout=30)  # type: ignore[misc]
    base = f"http://127.0.0.1:{server.http_port}/v1"
    client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    assert [m.id async for m in client.models.list()] == ["sim"]
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("ghost")
    assert "models served: sim" in caught.value.message
    await client.close()
