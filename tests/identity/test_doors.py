"""JWT identities through both doors of a running fairq: gRPC metadata and HTTP headers."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.identity import JwtConfig
from fairq_server.config.schema import ConfigError, HttpConfig, KeyConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .idp import AUDIENCE, ISSUER, JwksServer, SigningKey, claims, jwks, serve_jwks

RSA = SigningKey.rsa("rsa-door")
EC = SigningKey.ec("ec-door")
GEN = scheduler_pb2.GenerateRequest(
    model="sim", prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
)
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
KEY = KeyConfig("svc", hash_key("fq_service-key"), team="platform")


@dataclass
class Running:
    server: FairqServer
    idp: JwksServer

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def chat_url(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}/v1/chat/completions"


def jwt_config(url: str = "", **kw: Any) -> JwtConfig:
    return JwtConfig(
        issuer=ISSUER,
        audience=(AUDIENCE, "account"),
        jwks_url=url,
        user_claim="preferred_username",
        team_claim="team",
        tiers_claim="realm_access.roles",
        admin_claim="realm_access.roles",
        admin_value="fairq-admin",
        **kw,
    )


def token(user: str, *roles: str, key: SigningKey = RSA, **extra: Any) -> str:
    roles = roles or ("standard", "batch")
    return key.sign(
        claims("sub-" + user, preferred_username=user, realm_access={"roles": list(roles)}, **extra)
    )


@pytest.fixture
async def running(sim: SimServer, fairq_factory: FairqFactory) -> AsyncIterator[Running]:
    async with serve_jwks(jwks(RSA, EC)) as (idp, _):
        config = replace(
            make_config([sim_backend(sim)], keys=[KEY]),
            http=HttpConfig(listen="127.0.0.1:0"),
            jwt=jwt_config(idp.url),
        )
        yield Running(await fairq_factory(config), idp)


async def generate(target: str, bearer: str, **kw: Any) -> list[scheduler_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        call = stub.Generate(
            replace_request(**kw), metadata=[("authorization", f"Bearer {bearer}")], timeout=10
        )
        return [r async for r in call]


def replace_request(**kw: Any) -> scheduler_pb2.GenerateRequest:
    request = scheduler_pb2.GenerateRequest()
    request.CopyFrom(GEN)
    for k, v in kw.items():
        setattr(request, k, v)
    return request


async def chat(url: str, bearer: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {bearer}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=CHAT, headers=headers) as r,
    ):
        return r.status, json.loads(await r.read())


async def test_a_valid_token_is_served_on_both_doors(running: Running) -> None:
    events = await generate(running.target, token("alice", key=RSA))
    assert events[-1].finished.usage.completion_tokens == 4
    status, doc = await chat(running.chat_url, token("alice", key=EC))
    assert status == 200 and doc["usage"]["completion_tokens"] == 4
    # API keys keep working beside tokens, on both doors.
    events = await generate(running.target, "fq_service-key")
    assert events[-1].finished.usage.completion_tokens == 4
    status, _ = await chat(running.chat_url, "fq_service-key")
    assert status == 200
    # The tiers claim bounds the token: standard is its ceiling, interactive is refused.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(running.target, token("alice"), tier="interactive")
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert running.idp.fetches == 1


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: token("alice", exp=int(time.time()) - 3600), "JWT expired"),
        (lambda: token("alice", aud="other"), "audience is not accepted"),
        (lambda: SigningKey.rsa("rsa-door").sign(claims(preferred_username="x")), "bad signature"),
        (lambda: SigningKey.rsa("nobody").sign(claims(preferred_username="x")), "kid) is unknown"),
        (lambda: RSA.sign(claims()), "no 'preferred_username' claim"),
    ],
    ids=["expired", "audience", "signature", "kid", "user-claim"],
)
async def test_refused_tokens_on_both_doors(running: Running, make: Any, needle: str) -> None:
    bad = make()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(running.target, bad)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert needle in (info.value.details() or "")
    status, doc = await chat(running.chat_url, bad)
    assert status == 401 and doc["error"]["type"] == "authentication_error"
    assert needle in doc["error"]["message"]
    for part in bad.split("."):
        assert part not in doc["error"]["message"] and part not in (info.value.details() or "")


async def test_admin_claim_reaches_the_admin_service(running: Running) -> None:
    async with grpc.aio.insecure_channel(running.target) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        md = [("authorization", f"Bearer {token('root', 'batch', 'fairq-admin')}")]
        listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=md)
        assert [b.backend.id for b in listed.backends] == ["sim-a"]
        md = [("authorization", f"Bearer {token('alice', 'batch')}")]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=md)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "user 'alice' is not an admin" in (info.value.details() or "")


async def test_long_unicode_and_key_shaped_users_are_reported_verbatim(running: Running) -> None:
    users = ["ü" * 199 + "a", "ü" * 199 + "b", "fq_" + "Z" * 43]
    for user in users:
        await generate(running.target, token(user))
    async with grpc.aio.insecure_channel(running.target) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        md = [("authorization", f"Bearer {token('root', 'fairq-admin')}")]
        snap = await admin.GetQueueSnapshot(
            admin_pb2.GetQueueSnapshotRequest(top_users=100), metadata=md
        )
    assert {u.user for u in snap.users} >= set(users)


async def test_bad_jwks_file_is_a_config_error_at_start_and_at_reload(
    running: Running, tmp_path: Path
) -> None:
    missing = replace(
        running.server.config, jwt=replace(jwt_config(), jwks_file=str(tmp_path / "no"))
    )
    with pytest.raises(ConfigError, match=r"jwt\.jwks_file: cannot read JWKS file"):
        FairqServer(missing)
    with pytest.raises(ConfigError, match=r"jwt\.jwks_file"):
        await running.server.reload(missing)
    # Refused whole: tokens are still verified against the URL's keys.
    assert (await generate(running.target, token("alice")))[-1].finished.usage.completion_tokens
    # A valid file is taken on reload; the URL's keys no longer count.
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(EC)))
    await running.server.reload(replace(missing, jwt=replace(missing.jwt, jwks_file=str(path))))
    assert (await generate(running.target, token("bob", key=EC)))[-1].finished.usage
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(running.target, token("alice", key=RSA))
    assert "kid) is unknown" in (info.value.details() or "")
