"""Admin RPCs, health and reflection on an in-process server."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.loader import parse_config
from fairq_server.errors import ConfigError
from fairq_sim import SimConfig, SimServer

from ..conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend

ROOT = (("authorization", "Bearer root-key"),)
ALICE = (("authorization", "Bearer alice-key"),)


def backend(sim: SimServer, **kw: object) -> admin_pb2.Backend:
    return admin_pb2.Backend(
        id="sim-b",
        kind=admin_pb2.BACKEND_KIND_VLLM,
        base_url=sim.url,
        models=["sim"],
        **kw,  # type: ignore[arg-type]
    )


async def test_register_list_generate_deregister(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        sched = scheduler_pb2_grpc.SchedulerStub(ch)
        gen = scheduler_pb2.GenerateRequest(
            model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [r async for r in sched.Generate(gen, metadata=ALICE)]
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

        reg = await admin.RegisterBackend(
            admin_pb2.RegisterBackendRequest(backend=backend(sim)), metadata=ROOT
        )
        assert reg.status.healthy
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=ROOT)
        assert [b.backend.id for b in listed.backends] == ["sim-b"]
        assert listed.backends[0].backend.base_url == sim.url

        events = [r async for r in sched.Generate(gen, metadata=ALICE)]
        assert events[1].started.backend_id == "sim-b"
        assert events[-1].finished.usage.completion_tokens == 4

        await admin.DeregisterBackend(
            admin_pb2.DeregisterBackendRequest(id="sim-b", drain=True), metadata=ROOT
        )
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=ROOT)
        assert list(listed.backends) == []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.DeregisterBackend(
                admin_pb2.DeregisterBackendRequest(id="sim-b"), metadata=ROOT
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_list_backends_healthy_needs_fresh_metrics(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """admin.proto: healthy = the last scrape succeeded *and* is fresh. A backend whose last
    scrape succeeded but is older than stale_after (the gate refuses it) is not healthy."""
    server = await fairq_factory(make_config([sim_backend(sim)]))
    entry = server.core.backend("sim-a")
    assert entry is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        before = await admin.ListBackends(admin_pb2.ListBackendsRequest())
        await freeze_gate(server)  # no more scrapes; the last one is aged far past stale_after
        after = await admin.ListBackends(admin_pb2.ListBackendsRequest())
    assert before.backends[0].healthy
    assert entry.healthy is True  # the last scrape did succeed
    assert not after.backends[0].healthy


@pytest.mark.parametrize(
    ("metadata", "code", "needle"),
    [
        (ALICE, grpc.StatusCode.PERMISSION_DENIED, "user 'alice' is not an admin"),
        ((), grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization"),
    ],
)
async def test_admin_requires_admin_key(
    fairq_factory: FairqFactory,
    metadata: tuple[tuple[str, str], ...],
    code: grpc.StatusCode,
    needle: str,
) -> None:
    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=metadata)
    assert info.value.code() == code
    assert needle in (info.value.details() or "")


@pytest.mark.parametrize(
    ("url", "kind", "models", "needle"),
    [
        ("file:///etc/passwd", admin_pb2.BACKEND_KIND_VLLM, ["m"], "must be http(s)"),
        ("http://user:pw@127.0.0.1:1", admin_pb2.BACKEND_KIND_VLLM, ["m"], "credentials"),
        ("http://127.0.0.1:1", admin_pb2.BACKEND_KIND_UNSPECIFIED, ["m"], "backend.kind"),
        ("http://127.0.0.1:1", admin_pb2.BACKEND_KIND_TGI, [], "at least one named model"),
    ],
)
async def test_register_validates_input(
    fairq_factory: FairqFactory, url: str, kind: int, models: list[str], needle: str
) -> None:
    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    bad = admin_pb2.Backend(id="x", kind=kind, base_url=url, models=models)  # type: ignore[arg-type]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.RegisterBackend(
                admin_pb2.RegisterBackendRequest(backend=bad), metadata=ROOT
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (info.value.details() or "")
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=ROOT)
        assert list(listed.backends) == []


async def test_health_and_reflection(fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config())
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "fairq.v1.Scheduler", "fairq.v1.Admin"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name async for r in responses for s in r.list_services_response.service}
    assert {"fairq.v1.Scheduler", "fairq.v1.Admin", "grpc.health.v1.Health"} <= names


# One backend definition, broken one way at a time: the file and RegisterBackend refuse it
# for the same reason, in the same words (config/backends.py holds the rules once).
_BROKEN = {
    "priority-order": ({"priority_order": "random"}, "backend priority_order must be one of"),
    "fair-share": (
        {"fair_share_priority": True},
        "backend fair_share_priority needs priority_scheduling",
    ),
    "long-metric": ({"waiting_metric": "w" * 300}, "backend waiting_metric is longer than 256"),
    "preempt": ({"preempt": True}, "preempt needs max_in_flight"),
}


@pytest.mark.parametrize("settings,needle", _BROKEN.values(), ids=_BROKEN.keys())
async def test_file_and_register_backend_refuse_alike(
    sim: SimServer, fairq_factory: FairqFactory, settings: dict[str, object], needle: str
) -> None:
    table = {"id": "sim-b", "kind": "openai", "base_url": sim.url, "models": ["sim"], **settings}
    with pytest.raises(ConfigError) as refused:
        parse_config({"backends": [table]})
    assert str(refused.value).startswith(f"backends[0]: {needle}")

    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    rpc = backend(sim, **settings)
    rpc.kind = admin_pb2.BACKEND_KIND_OPENAI
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.RegisterBackend(
                admin_pb2.RegisterBackendRequest(backend=rpc), metadata=ROOT
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith(needle)
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=ROOT)
        assert list(listed.backends) == []


async def test_register_cannot_send_fairqs_own_secrets(
    fairq_factory: FairqFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backend accepts exactly the Redis password: were it sent, the registration would
    # succeed and the backend would be healthy.
    monkeypatch.setenv("FAIRQ_REDIS_PASSWORD", "redis-secret")
    monkeypatch.setenv("FAIRQ_BACKEND_KEY_SIM", "redis-secret")
    config = SimConfig(mode="vllm", model="sim", speed=20.0, api_key="redis-secret")
    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    async with (
        SimServer(config) as sim,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch,
    ):
        admin = admin_pb2_grpc.AdminStub(ch)
        details = set()
        for name in ("FAIRQ_REDIS_PASSWORD", "FAIRQ_UNSET_NAME", "FAIRQ_BACKEND_KEY_UNSET"):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await admin.RegisterBackend(
                    admin_pb2.RegisterBackendRequest(backend=backend(sim, api_key_env=name)),
                    metadata=ROOT,
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details.add(info.value.details())
        assert len(details) == 1, details  # no oracle for which variables exist
        assert "FAIRQ_BACKEND_KEY_" in details.pop()
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=ROOT)
        assert list(listed.backends) == []
        reg = await admin.RegisterBackend(
            admin_pb2.RegisterBackendRequest(
                backend=backend(sim, api_key_env="FAIRQ_BACKEND_KEY_SIM")
            ),
            metadata=ROOT,
        )
        assert reg.status.healthy


async def test_register_backend_sets_preempt(sim: SimServer, fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    spec = backend(sim, preempt=True, max_in_flight=4)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        reg = await admin.RegisterBackend(
            admin_pb2.RegisterBackendRequest(backend=spec), metadata=ROOT
        )
        assert reg.status.backend.preempt and reg.status.backend.max_in_flight == 4
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=ROOT)
        assert listed.backends[0].backend.preempt
    state = server.core.backend("sim-b")
    assert state is not None and state.backend.preempt and state.max_in_flight == 4
