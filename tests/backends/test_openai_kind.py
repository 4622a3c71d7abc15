"""The generic OpenAI-compatible kind, credentials, the /v1/models check and gRPC pass-through.

Against the simulator in SGLang and vLLM mode over real loopback HTTP and gRPC.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.backends.openai import OpenAIBackend, metric_map
from fairq_server.config.loader import parse_config
from fairq_server.config.schema import BackendConfig, ConfigError
from fairq_server.errors import InvalidRequestError
from fairq_sim import SimConfig, SimServer

from ..conftest import KEYS, FairqFactory, make_config

ROOT = (("authorization", "Bearer root-key"),)
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


def openai_backend(sim: SimServer, **kw: object) -> BackendConfig:
    return BackendConfig("sg", "openai", sim.url, (sim.config.model,), **kw)  # type: ignore[arg-type]


async def generate(
    port: int, req: scheduler_pb2.GenerateRequest
) -> list[scheduler_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return [r async for r in stub.Generate(req)]


def _nested(depth: int) -> dict[str, object]:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return {"a": value}


def struct(value: dict[str, object]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


@pytest.fixture
async def sglang() -> object:
    async with SimServer(SimConfig(mode="sglang", model="sg", speed=20.0, max_num_seqs=4)) as s:
        yield s


async def test_sglang_preset_reads_sglang_metrics_and_serves(
    sglang: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([openai_backend(sglang, metrics_preset="sglang")]))
    entry = server.core.backend("sg")
    assert entry is not None and isinstance(entry.backend, OpenAIBackend)
    assert entry.backend.metrics.waiting == "sglang:num_queue_reqs"
    assert entry.healthy is True and entry.sample is not None
    req = scheduler_pb2.GenerateRequest(
        model="sg", prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=6)
    )
    events = await generate(server.port, req)
    assert events[-1].finished.usage.completion_tokens == 6
    text = sglang.state.metrics.render().decode()
    assert "sglang:generation_tokens_total" in text


async def test_sglang_priority_order_higher_first(sglang: SimServer) -> None:
    cfg = openai_backend(sglang, metrics_preset="sglang", priority_scheduling=True)
    backend = OpenAIBackend.from_config(cfg, timeout=5)
    from fairq_server.backends.request import BackendRequest

    _, body = backend.payload(BackendRequest(model="sg", prompt="x"), 2)
    assert body["priority"] == -2  # fairq's "lower runs earlier" turned around for SGLang
    low = OpenAIBackend.from_config(
        openai_backend(sglang, priority_scheduling=True, priority_order="lower-first",
                       metrics_preset="sglang"),
        timeout=5,
    )  # fmt: skip
    assert low.payload(BackendRequest(model="sg", prompt="x"), 2)[1]["priority"] == 2
    assert "request_id" not in body  # vLLM's own field is not sent to other servers


def test_metric_mapping_presets_overrides_and_errors() -> None:
    cfg = BackendConfig("x", "openai", "http://h:1", ("m",), metrics_preset="llamacpp")
    m = metric_map(cfg)
    assert (m.waiting, m.running) == ("llamacpp:requests_deferred", "llamacpp:requests_processing")
    assert m.tpot_sum == "llamacpp:tokens_predicted_seconds_total"
    custom = metric_map(
        BackendConfig("x", "openai", "http://h:1", ("m",), waiting_metric="q", tpot_metric="itl")
    )
    assert (custom.waiting, custom.tpot_sum, custom.tpot_count) == ("q", "itl_sum", "itl_count")
    with pytest.raises(InvalidRequestError, match="max_in_flight"):
        metric_map(BackendConfig("x", "openai", "http://h:1", ("m",)))
    with pytest.raises(InvalidRequestError, match="unknown"):
        metric_map(BackendConfig("x", "openai", "http://h:1", ("m",), metrics_preset="tgi"))
    with pytest.raises(InvalidRequestError, match="sum_name/count_name"):
        metric_map(
            BackendConfig("x", "openai", "http://h:1", ("m",), waiting_metric="q", tpot_metric="a/")
        )
    with pytest.raises(ConfigError, match="priority_order"):
        parse_config(
            {"backends": [{"id": "a", "kind": "openai", "base_url": "http://h:1",
                           "models": ["m"], "priority_order": "random"}]}
        )  # fmt: skip


async def test_without_metrics_the_gate_holds_at_the_slot_count(
    sglang: SimServer, fairq_factory: FairqFactory
) -> None:
    sglang.config.speed = 2.0
    server = await fairq_factory(
        make_config([openai_backend(sglang, metrics_preset="none", max_in_flight=2)])
    )
    entry = server.core.backend("sg")
    assert entry is not None and entry.healthy is True
    req = scheduler_pb2.GenerateRequest(
        model="sg", prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=12)
    )
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            engine = sglang.engine
            peak = max(peak, engine.num_running + engine.num_waiting)
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(*(generate(server.port, req) for _ in range(6)))
    done.set()
    await watcher
    assert all(r[-1].finished.usage.completion_tokens == 12 for r in results)
    # Two slots, and at most one request sent ahead for a slot about to free (lookahead).
    assert 1 <= peak <= 3


async def test_backend_api_key_from_env(
    fairq_factory: FairqFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = SimConfig(mode="vllm", model="sim", speed=20.0, api_key="s3cret")
    async with SimServer(config) as sim:
        plain = BackendConfig("v", "vllm", sim.url, ("sim",))
        server = await fairq_factory(make_config([plain]))
        entry = server.core.backend("v")
        assert entry is not None and entry.healthy is False
        assert "api_key_env or api_key_file" in entry.last_error

        monkeypatch.setenv("FAIRQ_TEST_BACKEND_KEY", "s3cret")
        keyed = BackendConfig("v", "vllm", sim.url, ("sim",), api_key_env="FAIRQ_TEST_BACKEND_KEY")
        server2 = await fairq_factory(make_config([keyed]))
        req = scheduler_pb2.GenerateRequest(
            model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=3)
        )
        events = await generate(server2.port, req)
        assert events[-1].finished.usage.completion_tokens == 3


async def test_api_key_file_and_rpc_restrictions(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    from fairq_server.backends.credentials import read_api_key

    key_file = Path(str(tmp_path)) / "key"
    key_file.write_text("abc123\n")
    cfg = BackendConfig("v", "vllm", "http://h:1", ("m",), api_key_file=str(key_file))
    assert read_api_key(cfg) == "abc123"
    with pytest.raises(InvalidRequestError, match="configuration file"):
        read_api_key(cfg, from_rpc=True)
    # Over the Admin API only FAIRQ_BACKEND_KEY_* may be read, and every refusal reads the
    # same: fairq's own secrets stay home, and the error does not tell which variables exist.
    monkeypatch.setenv("HOME_SECRET", "x")
    monkeypatch.setenv("FAIRQ_REDIS_PASSWORD", "redis-secret")
    monkeypatch.setenv("FAIRQ_BACKEND_KEY_EMPTY", " ")
    monkeypatch.setenv("FAIRQ_BACKEND_KEY_A", "backend-a-key")
    refusals = set()
    for name in (
        "HOME_SECRET", "FAIRQ_REDIS_PASSWORD", "FAIRQ_BACKEND_KEY_UNSET", "FAIRQ_BACKEND_KEY_EMPTY",
    ):  # fmt: skip
        rpc_cfg = BackendConfig("v", "vllm", "http://h:1", ("m",), api_key_env=name)
        with pytest.raises(InvalidRequestError, match="FAIRQ_BACKEND_KEY_") as info:
            read_api_key(rpc_cfg, from_rpc=True)
        refusals.add(str(info.value))
    assert len(refusals) == 1
    allowed = BackendConfig("v", "vllm", "http://h:1", ("m",), api_key_env="FAIRQ_BACKEND_KEY_A")
    assert read_api_key(allowed, from_rpc=True) == "backend-a-key"
    with pytest.raises(InvalidRequestError, match="not set"):
        read_api_key(BackendConfig("v", "vllm", "http://h:1", ("m",), api_key_env="FAIRQ_NOPE"))


async def test_models_check_refuses_over_rpc_and_marks_config_backend_unhealthy(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    wrong = BackendConfig("w", "vllm", sim.url, ("llama-70b",))
    server = await fairq_factory(make_config([wrong], keys=list(KEYS.values())))
    entry = server.core.backend("w")
    assert entry is not None and entry.healthy is False
    assert "does not serve llama-70b" in entry.last_error
    assert "lists: sim" in entry.last_error
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=ROOT)
        assert "does not serve llama-70b" in listed.backends[0].reason
        bad = admin_pb2.Backend(
            id="b", kind=admin_pb2.BACKEND_KIND_OPENAI, base_url=sim.url, models=["nope"],
            metrics_preset="none", max_in_flight=4,
        )  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.RegisterBackend(
                admin_pb2.RegisterBackendRequest(backend=bad), metadata=ROOT
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not serve nope" in (info.value.details() or "")
        good = admin_pb2.Backend(
            id="b", kind=admin_pb2.BACKEND_KIND_OPENAI, base_url=sim.url, models=["sim"],
            metrics_preset="none", max_in_flight=4,
        )  # fmt: skip
        reg = await admin.RegisterBackend(
            admin_pb2.RegisterBackendRequest(backend=good), metadata=ROOT
        )
        assert reg.status.healthy and reg.status.reason == ""
        assert reg.status.backend.kind == admin_pb2.BACKEND_KIND_OPENAI
        assert reg.status.backend.metrics_preset == "none"


async def test_grpc_extra_passes_tools_through_and_returns_tool_calls(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    from ..conftest import sim_backend

    server = await fairq_factory(make_config([sim_backend(sim)]))
    msgs = scheduler_pb2.ChatMessages(
        messages=[scheduler_pb2.ChatMessage(role="user", content="look it up")]
    )
    extra = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "lookup"}}}
    req = scheduler_pb2.GenerateRequest(
        model="sim",
        messages=msgs,
        sampling=scheduler_pb2.SamplingParams(max_tokens=5),
        extra=struct(extra),
    )
    events = await generate(server.port, req)
    chunks = [e.chunk for e in events if e.WhichOneof("event") == "chunk"]
    calls = [
        c
        for chunk in chunks
        if chunk.HasField("extra")
        for choice in json_format.MessageToDict(chunk.extra)["choices"]
        for c in choice["delta"]["tool_calls"]
    ]
    assert calls[0]["function"]["name"] == "lookup"
    arguments = "".join(c["function"].get("arguments", "") for c in calls)
    assert json.loads(arguments)["text"]
    assert events[-1].finished.usage.completion_tokens == 5


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"priority": -100}, "must not set priority"),
        ({"max_tokens": 10**6}, "must not set max_tokens"),
        ({"stream": False, "model": "x"}, "must not set model, stream"),
        ({"logit_bias": {"1": "x" * 300_000}}, "the limit is 262144"),
        (_nested(40), "levels deep"),
    ],
)
async def test_grpc_extra_refused(
    sim: SimServer, fairq_factory: FairqFactory, extra: dict[str, object], needle: str
) -> None:
    from ..conftest import sim_backend

    server = await fairq_factory(make_config([sim_backend(sim)]))
    req = scheduler_pb2.GenerateRequest(model="sim", prompt="hi", extra=struct(extra))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(server.port, req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (info.value.details() or "")


def test_grpc_extra_whole_numbers_reach_the_backend_as_integers() -> None:
    from fairq_server.backends.vllm import VllmBackend
    from fairq_server.config.schema import RequestBounds
    from fairq_server.doors.grpc.validation import to_backend_request

    req = scheduler_pb2.GenerateRequest(
        model="sim", prompt="hi",
        extra=struct({"n": 2, "top_k": 5, "frequency_penalty": 0.5, "stream_options": {"x": 1}}),
    )  # fmt: skip
    backend_request = to_backend_request(req, RequestBounds(max_sequences=2))
    _, body = VllmBackend("v", "http://h:1", ["sim"]).payload(backend_request, 0)
    # A Struct holds 2 as 2.0; vLLM's n must be an integer.
    assert type(body["n"]) is int and body["n"] == 2
    assert body["frequency_penalty"] == 0.5
    # The caller's stream options are kept; fairq adds the usage it charges by.
    assert body["stream_options"] == {"x": 1, "include_usage": True}
