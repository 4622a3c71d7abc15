"""Keys in the store: the Admin RPCs (in process) and the CLI against two ``fairq serve``
processes sharing one real PostgreSQL; a revoked key is refused by the other within 1 s."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sys
import time

import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.load import ChildProcess, start_fairq
from fairq_server.identity.auth import hash_key
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from .helpers import read_rows, store_config

ROOT = (("authorization", "Bearer root-key"),)


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def generate(target: str, key: str, model: str = "sim") -> grpc.StatusCode:
    """Run one small request with ``key``; its final status."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        req = scheduler_pb2.GenerateRequest(
            model=model, prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=3)
        )
        try:
            _ = [r async for r in stub.Generate(req, metadata=bearer(key), timeout=10)]
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def accepted(target: str, key: str) -> None:
    """Wait until ``target`` serves a request with ``key`` (a replica polls the store's keys)."""
    async with asyncio.timeout(5):
        while await generate(target, key) != grpc.StatusCode.OK:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_admin_rpcs_create_list_revoke_rotate(
    sim: SimServer, fairq_factory: FairqFactory, store_url: str
) -> None:
    keys = (KEYS["root-key"], KEYS["alice-key"])
    server = await fairq_factory(store_config(store_url, [sim_backend(sim)], keys=keys))
    target = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(target) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        # Admin only.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.CreateKey(
                admin_pb2.CreateKeyRequest(user="x"), metadata=bearer("alice-key")
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Bad input, named.
        for bad, needle in [
            (admin_pb2.CreateKeyRequest(user=""), "user must be 1-128"),
            (admin_pb2.CreateKeyRequest(user="x", tiers=["gold"]), "unknown tiers ['gold']"),
            (admin_pb2.CreateKeyRequest(user="x" * 129), "user must be 1-128"),
            (admin_pb2.CreateKeyRequest(user="x", team="t" * 257), "team is longer than 256"),
            (admin_pb2.CreateKeyRequest(user="x", team="a\nb"), "team contains control"),
            (admin_pb2.CreateKeyRequest(user="x", expires_in_seconds=-1), "expires_in_seconds"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await admin.CreateKey(bad, metadata=ROOT)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in (info.value.details() or ""), info.value.details()
        # A name that is unicode and key-shaped is stored and reported verbatim.
        odd = "Bearer fq_ü\u2028" + "é" * 100
        made = await admin.CreateKey(
            admin_pb2.CreateKeyRequest(user=odd, team="red", tiers=["batch"]), metadata=ROOT
        )
        secret = made.secret
        assert secret.startswith("fq_") and made.key.user == odd and made.key.team == "red"
        # A team name is up to 256 characters, as in the file, quotas and budgets.
        long_team = await admin.CreateKey(
            admin_pb2.CreateKeyRequest(user="y", team="t" * 256), metadata=ROOT
        )
        assert long_team.key.team == "t" * 256
        await admin.RevokeKey(admin_pb2.RevokeKeyRequest(id=long_team.key.id), metadata=ROOT)
        assert await generate(target, secret) == grpc.StatusCode.OK
        assert server.store is not None
        await server.store.ledger.flush()
        rows = await read_rows(store_url)
        assert [(r["user_name"], r["team"], r["tier"]) for r in rows] == [(odd, "red", "batch")]
        # Only the digest is stored.
        listed = await admin.ListKeys(admin_pb2.ListKeysRequest(), metadata=ROOT)
        assert [k.id for k in listed.keys] == [made.key.id]
        assert secret not in str(listed)
        assert server.store.keys.lookup(bytes.fromhex(hash_key(secret))) is not None
        # Rotate: the new key works, the old one does not.
        rotated = await admin.RotateKey(admin_pb2.RotateKeyRequest(id=made.key.id), metadata=ROOT)
        assert rotated.key.replaces == made.key.id and rotated.key.user == odd
        assert await generate(target, rotated.secret) == grpc.StatusCode.OK
        assert await generate(target, secret) == grpc.StatusCode.UNAUTHENTICATED
        # Revoke.
        await admin.RevokeKey(admin_pb2.RevokeKeyRequest(id=rotated.key.id), metadata=ROOT)
        assert await generate(target, rotated.secret) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.RevokeKey(admin_pb2.RevokeKeyRequest(id="nope"), metadata=ROOT)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        everything = await admin.ListKeys(
            admin_pb2.ListKeysRequest(include_revoked=True), metadata=ROOT
        )
        assert len(everything.keys) == 3 and all(k.revoked_at_unix_seconds for k in everything.keys)
        # The config file's keys keep working beside the store's.
        assert await generate(target, "alice-key") == grpc.StatusCode.OK


async def test_expired_and_grace(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: object
) -> None:
    url = f"sqlite:///{tmp_path}/k.db"
    server = await fairq_factory(store_config(url, [sim_backend(sim)], keys=(KEYS["root-key"],)))
    assert server.store is not None
    keys = server.store.keys
    _, short = await keys.create("sam", expires_at=time.time() + 3.0)
    old, secret = await keys.create("tom")
    rotated = await keys.rotate(old.id, grace_seconds=3.0)
    assert rotated is not None
    target = f"127.0.0.1:{server.port}"
    assert await generate(target, short) == grpc.StatusCode.OK
    assert await generate(target, secret) == grpc.StatusCode.OK  # within its grace
    # Real clock: a live server compares the keys' expiry with time.time().
    deadline = time.time() + 3.05
    await asyncio.sleep(max(deadline - time.time(), 0))  # the expiry itself is the subject
    assert await generate(target, short) == grpc.StatusCode.UNAUTHENTICATED
    assert await generate(target, secret) == grpc.StatusCode.UNAUTHENTICATED
    assert await generate(target, rotated[1]) == grpc.StatusCode.OK


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairq_server", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(240):  # a CLI start takes ~1 s, but minutes under heavy load
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def serve_config(sim: SimServer, url: str) -> str:
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\npoll_interval_seconds = 0.05\n"
        f'[[backends]]\nid = "sim-a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
        f'[[keys]]\nuser = "root"\nsha256 = "{hash_key("root-key")}"\nadmin = true\n'
        f'[store]\nurl = "{url}"\nflush_seconds = 0.05\n'
        "[prices.sim]\ninput_per_million = 1.0\noutput_per_million = 3.0\n"
    )


@pytest.mark.timeout(900)  # two fairq processes and six CLI runs; slow on a loaded machine
async def test_cli_keys_on_two_replicas_revoked_refused_within_a_second(
    sim: SimServer, postgres_url: str
) -> None:
    replicas: list[ChildProcess] = []
    try:
        started = await asyncio.gather(
            *(start_fairq(serve_config(sim, postgres_url), ready_timeout=300) for _ in range(2)),
            return_exceptions=True,
        )
        replicas.extend(r for r in started if isinstance(r, ChildProcess))
        assert len(replicas) == 2, started  # both migrate the fresh database at once
        a, b = (r.address for r in replicas)
        auth = ("--api-key", "root-key")
        code, out, err = await cli(
            "keys", "create", "--target", a, *auth, "--user", "carol", "--team", "red",
            "--tiers", "standard,batch", "--json",
        )  # fmt: skip
        assert code == 0, err
        made = json.loads(out)
        assert made["team"] == "red" and made["tiers"] == ["standard", "batch"]
        secret = made["key"]
        # The other replica learns of the new key by its poll.
        await accepted(b, secret)
        code, out, err = await cli("keys", "list", "--target", b, *auth)
        assert code == 0 and made["id"] in out and "carol" in out and secret not in out, err
        # Revoke on A; B refuses it within a second.
        code, out, err = await cli("keys", "revoke", made["id"], "--target", a, *auth)
        assert code == 0 and f"revoked {made['id']}" in out, err
        revoked_at = time.monotonic()
        not_found = 0  # attempts B authenticated before it learned of the revocation
        while True:
            # An attempt begun a second or more after the revocation must be refused (a
            # request for a model nobody serves passes authentication and fails at once).
            asked_at = time.monotonic()
            code = await generate(b, secret, model="no-such-model")
            if code == grpc.StatusCode.UNAUTHENTICATED:
                break
            assert code == grpc.StatusCode.NOT_FOUND, code
            not_found += 1
            assert asked_at - revoked_at < 1.0, "B still accepts a key revoked a second ago"
        # Rotate through the CLI too; unknown ids and non-admins are refused, named.
        code, out, err = await cli(
            "keys", "create", "--target", a, *auth, "--user", "dan", "--json"
        )
        dan = json.loads(out)
        code, out, err = await cli("keys", "rotate", dan["id"], "--target", b, *auth, "--json")
        assert code == 0, err
        assert json.loads(out)["replaces"] == dan["id"]
        await accepted(a, json.loads(out)["key"])  # made on B: A learns of it by its poll
        code, _, err = await cli("keys", "revoke", "nope", "--target", a, *auth)
        assert code == 1 and "NOT_FOUND" in err
        # The usage report over both replicas' rows.
        code, out, err = await cli(
            "usage", "--by", "team", "--since", "1h", "--csv", "--target", b, *auth
        )
        assert code == 0, err
        table = list(csv.reader(io.StringIO(out)))
        assert table[0] == ["team", "requests", "finished", "input_tokens", "output_tokens", "cost"]
        red = [row for row in table[1:] if row[0] == "red"]
        # carol's one served request, and her requests for a model nobody serves that B
        # authenticated: recorded (refused at admission, outcome not_found) but not charged.
        # Those refused by authentication are not hers and not recorded.
        assert len(red) == 1 and red[0][1:3] == [str(1 + not_found), "1"], (red, not_found)
        assert int(red[0][4]) == 3 and float(red[0][5]) == pytest.approx(1.1e-05)
    finally:
        for replica in replicas:
            await replica.stop()
