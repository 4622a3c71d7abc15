"""Admin/GetQueueSnapshot, the access log, open-mode warnings and process metrics, in-process."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import aiohttp
import grpc
import pytest

import fairq
from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import HttpConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend

ROOT = (("authorization", "Bearer root-key"),)
ALICE = (("authorization", "Bearer alice-key"),)
BOB = (("authorization", "Bearer bob-key"),)


def gen(tier: str = "", max_tokens: int = 4) -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(
        model="sim", prompt="hi", tier=tier,
        sampling=scheduler_pb2.SamplingParams(max_tokens=max_tokens),
    )  # fmt: skip


async def test_snapshot_reports_depth_per_tier_top_users_and_gates(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        sched = scheduler_pb2_grpc.SchedulerStub(ch)
        admin = admin_pb2_grpc.AdminStub(ch)
        # Served first: alice has recent service, nothing queued.
        done = [e async for e in sched.Generate(gen("batch", 8), metadata=ALICE)]
        served = done[-1].finished.usage
        await freeze_gate(server)
        calls = [sched.Generate(gen("interactive"), metadata=BOB) for _ in range(3)]
        calls += [sched.Generate(gen("batch"), metadata=ALICE) for _ in range(2)]
        for call in calls:  # the first event of each stream says it is queued
            assert (await call.read()).WhichOneof("event") == "queued"

        snap = await admin.GetQueueSnapshot(admin_pb2.GetQueueSnapshotRequest(), metadata=ROOT)
        [model] = snap.models
        assert (model.model, model.queued, model.queued_users) == ("sim", 5, 2)
        assert [(t.tier, t.queued) for t in model.tiers] == [
            ("interactive", 3), ("standard", 0), ("batch", 2),
        ]  # fmt: skip
        assert [(u.user, u.queued) for u in snap.users] == [("bob", 3), ("alice", 2)]
        alice = snap.users[1]
        tokens = served.prompt_tokens + served.completion_tokens
        assert 0.5 * tokens < alice.recent_tokens <= tokens
        assert snap.known_users == 2
        [backend] = snap.backends
        assert backend.status.backend.id == "sim-a"
        # The frozen gate refuses every tier as stale; the snapshot says so per tier.
        assert [(g.tier, g.state) for g in backend.gates] == [
            ("interactive", "stale"), ("standard", "stale"), ("batch", "stale"),
        ]  # fmt: skip
        assert snap.taken_at_unix_seconds > 1.7e9

        one = await admin.GetQueueSnapshot(
            admin_pb2.GetQueueSnapshotRequest(top_users=1), metadata=ROOT
        )
        assert [u.user for u in one.users] == ["bob"] and one.known_users == 2

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.GetQueueSnapshot(admin_pb2.GetQueueSnapshotRequest(), metadata=ALICE)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.GetQueueSnapshot(admin_pb2.GetQueueSnapshotRequest())
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for call in calls:
            call.cancel()


async def test_python_client_reads_the_snapshot(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    async with fairq.AsyncClient(f"127.0.0.1:{server.port}", user="carol") as client:
        await client.complete("sim", "hello", max_tokens=4)
        snap = await client.queue_snapshot(top_users=5)
    assert snap.models[0].model == "sim" and snap.models[0].queued == 0
    assert snap.models[0].tiers[0] == ("interactive", 0)
    assert snap.users[0].user == "carol" and snap.users[0].recent_tokens > 0
    assert snap.backends[0].status.healthy
    assert dict(snap.backends[0].gates)["interactive"] == "admit"
    with pytest.raises(ValueError):
        await fairq.AsyncClient("127.0.0.1:1").queue_snapshot(top_users=-1)


async def test_access_log_writes_one_json_line_per_finished_request(
    sim: SimServer, fairq_factory: FairqFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    config = replace(make_config([sim_backend(sim)], keys=list(KEYS.values())), access_log=True)
    server = await fairq_factory(config)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        sched = scheduler_pb2_grpc.SchedulerStub(ch)
        events = [e async for e in sched.Generate(gen("standard", 5), metadata=ALICE)]
        with pytest.raises(grpc.aio.AioRpcError):
            bad = scheduler_pb2.GenerateRequest(model="nope", prompt="x")
            [e async for e in sched.Generate(bad, metadata=ALICE)]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ok, missing = lines
    finished = events[-1].finished
    assert ok["outcome"] == "finished" and ok["backend"] == "sim-a"
    assert ok["request_id"] == events[1].started.request_id
    assert (ok["user_group"], ok["tier"], ok["model"]) == ("default", "standard", "sim")
    assert ok["completion_tokens"] == finished.usage.completion_tokens == 5
    assert ok["prompt_tokens"] == finished.usage.prompt_tokens
    assert ok["queue_seconds"] == pytest.approx(finished.timings.queue_seconds, abs=1e-3)
    assert ok["queue_seconds"] <= ok["ttft_seconds"] <= ok["total_seconds"]
    assert "alice" not in json.dumps(ok)
    assert missing["outcome"] == "not_found" and missing["model"] == "nope"
    assert missing["backend"] == "" and missing["queue_seconds"] is None


async def test_http_requests_in_the_access_log_and_the_snapshot(
    sim: SimServer, fairq_factory: FairqFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    config = replace(make_config([sim_backend(sim)], keys=list(KEYS.values())), access_log=True)
    server = await fairq_factory(replace(config, http=HttpConfig(listen="127.0.0.1:0")))
    url = f"http://127.0.0.1:{server.http_port}/v1/chat/completions"
    chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    headers = {"authorization": "Bearer alice-key", "x-fairq-tier": "standard"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(url, json={**chat, "stream": True}) as resp:
            assert resp.status == 200
            await resp.read()
        async with session.post(url, json=chat) as resp:
            assert resp.status == 200
            answer = await resp.json()
        async with session.post(url, json={**chat, "model": "nope"}) as resp:
            assert resp.status == 404
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    streamed, merged, missing = lines
    for line in (streamed, merged):
        assert line["outcome"] == "finished" and line["backend"] == "sim-a"
        assert (line["user_group"], line["tier"], line["model"]) == ("default", "standard", "sim")
        assert line["completion_tokens"] == 5 and line["prompt_tokens"] > 0
        assert line["queue_seconds"] <= line["ttft_seconds"] <= line["total_seconds"]
    assert merged["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert missing["outcome"] == "not_found" and missing["model"] == "nope"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        snap = await admin.GetQueueSnapshot(admin_pb2.GetQueueSnapshotRequest(), metadata=ROOT)
    [alice] = snap.users
    assert alice.user == "alice"
    assert alice.recent_tokens > 0.5 * (streamed["prompt_tokens"] + 10)


async def test_access_log_is_off_by_default(
    sim: SimServer, fairq_factory: FairqFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        [e async for e in scheduler_pb2_grpc.SchedulerStub(ch).Generate(gen())]
    assert capsys.readouterr().out == ""


async def test_open_mode_warns_at_start_and_once_for_an_ignored_key(
    sim: SimServer, fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server = await fairq_factory(make_config([sim_backend(sim)]))
    assert any("OPEN MODE" in r.message for r in caplog.records)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        for _ in range(2):
            [e async for e in stub.Generate(gen(), metadata=(("authorization", "Bearer k"),))]
    ignored = [r for r in caplog.records if "the key is ignored" in r.message]
    assert len(ignored) == 1


async def test_keyed_server_does_not_warn_open_mode(
    sim: SimServer, fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    assert not any("OPEN MODE" in r.message for r in caplog.records)


async def test_process_and_build_info_metrics_are_exported(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    registry = server.core.telemetry.registry
    assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 1e6
    assert registry.get_sample_value("process_cpu_seconds_total") is not None
    assert registry.get_sample_value("process_open_fds") is not None
    build = [
        s for m in registry.collect() if m.name == "fairq_build" for s in m.samples
    ]  # fmt: skip
    assert build and build[0].value == 1 and build[0].labels["version"] == "0.1.0"
