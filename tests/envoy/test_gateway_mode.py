"""An Inference Extension gateway's Envoy: streamed bodies both ways, no Lua, no access log.

Such a gateway (Envoy Gateway, kgateway, ...) writes its own Envoy configuration: it sends
the request body streamed (``FULL_DUPLEX_STREAMED``) and the response's headers and body to
the picker. fairq answers them all: the destination with the headers' answer, the body sent
back, the response passed on (its usage read from it), the slot freed at the stream's end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fairq_bench.envoy_process import EnvoyProcess
from fairq_server.doors.extproc.bootstrap import EnvoySetup, bootstrap, to_yaml
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from ..http.test_door import CHAT, post, until
from .conftest import with_extproc
from .test_door import events, read_stream


def gateway_like(port: int, admin: int, extproc: str) -> str:
    doc: dict[str, Any] = bootstrap(
        EnvoySetup(f"127.0.0.1:{port}", [("fairq", extproc)], 60.0, f"127.0.0.1:{admin}")
    )
    manager = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    config = manager["typed_config"]
    config["access_log"] = []
    config["http_filters"] = [f for f in config["http_filters"] if "lua" not in f["name"]]
    ext_proc = next(f for f in config["http_filters"] if "ext_proc" in f["name"])
    ext_proc["typed_config"]["processing_mode"] = {
        "request_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_header_mode": "SEND",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "response_trailer_mode": "SEND",
    }
    return to_yaml(doc)


async def test_a_gateway_that_streams_both_ways_is_answered(
    sim: SimServer, fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> None:
    config = with_extproc(make_config([sim_backend(sim)]))
    server = await fairq_factory(config)
    envoy = EnvoyProcess(
        [], render=lambda port, admin: gateway_like(port, admin, config.extproc.listen)
    )
    envoys.append(envoy)
    await asyncio.to_thread(envoy.start)
    status, _, doc = await post(envoy.url + "/v1/chat/completions", CHAT)
    assert status == 200, doc
    assert doc["usage"]["completion_tokens"] == 4
    raw = await read_stream(
        envoy.url + "/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 9}
    )
    assert events(raw)[-1] == "[DONE]"
    await until(lambda: server.core.live_requests() == 0)
