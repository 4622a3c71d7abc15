"""The Redis fixture itself: a real server that answers, and starts empty after a restart."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import grpc
import pytest

from fairq_bench.redis_process import RedisProcess
from fairq_server.cluster.connection import connect
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.loader import parse_config
from fairq_server.config.schema import ConfigError
from fairq_sim import SimServer
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import gen_request, generate, run_call, until


async def test_redis_server_answers_and_restarts_empty(redis_server: RedisProcess) -> None:
    # The replica's own client: it reconnects after the restart by itself.
    client = connect(ClusterConfig(redis_server.url, replica_id="t"))
    try:
        await client.set("k", "v")
        assert await client.get("k") == b"v"
        redis_server.stop()
        redis_server.start()
        assert await client.get("k") is None  # persistence is off: restarted empty
    finally:
        await client.aclose()


async def test_password_from_the_url_or_from_password_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with RedisProcess.running(password="s3cret") as server:
        bare = f"redis://127.0.0.1:{server.port}/0"
        monkeypatch.setenv("FAIRQ_TEST_REDIS_PW", "s3cret")
        for config in (
            ClusterConfig(server.url, replica_id="t"),
            ClusterConfig(bare, password_env="FAIRQ_TEST_REDIS_PW", replica_id="t"),
        ):
            client = connect(config)
            try:
                assert await client.ping()
            finally:
                await client.aclose()
        client = connect(ClusterConfig(bare, replica_id="t"))
        try:
            with pytest.raises(Exception, match=r"(?i)auth"):
                await client.ping()
        finally:
            await client.aclose()


def test_cluster_section_is_parsed_and_checked() -> None:
    assert parse_config({}).cluster is None
    config = parse_config(
        {"cluster": {"redis_url": "rediss://h:6380/0", "replica_id": "r1"}, "state_file": "s"}
    )
    assert config.cluster is not None
    assert (config.cluster.replica_id, config.cluster.lease_seconds) == ("r1", 5.0)
    assert config.cluster.safe_url == "rediss://h:6380/0"
    assert config.state_file == "s"
    assert parse_config({"cluster": {"redis_url": "redis://h"}}).cluster.replica_id.endswith(
        f"-{os.getpid()}"
    )  # type: ignore[union-attr]
    for bad, message in (
        ({"redis_url": "http://h"}, "redis_url"),
        ({"redis_url": "redis://h", "lease_seconds": 0}, "lease_seconds"),
        ({"redis_url": "redis://h", "local_share": 2}, "local_share"),
        ({"redis_url": "redis://h", "password_env": "FAIRQ_UNSET_VAR_X"}, "FAIRQ_UNSET_VAR_X"),
        ({"redis_url": "redis://h", "lease": 1}, "unknown keys"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config({"cluster": bad})


def test_single_process_path_does_not_import_redis() -> None:
    """No ``[cluster]``: the server modules load without the Redis client."""
    code = (
        "import sys, fairq_server.app, fairq_server.cli, fairq_server.config.schema;"
        "sys.exit('redis' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


async def test_redis_unreachable_at_start_forwards_on_the_local_share(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    dead = RedisProcess()  # a free port nobody listens on
    config = replace(
        make_config([sim_backend(sim)]),
        cluster=ClusterConfig(dead.url, replica_id="lonely", local_share=0.5, lease_seconds=1.0),
    )
    dead.close()
    server = await fairq_factory(config)
    state = server.core.backend("sim-a")
    assert state is not None
    await until(lambda: state.share == 0.5, what="the backend on the local share")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        outcome = await run_call(generate(channel, gen_request()))
    assert outcome.code is grpc.StatusCode.OK, outcome
    cluster = server.core.cluster
    assert cluster is not None and not cluster.connected


async def test_a_replica_reserves_through_a_tls_redis_with_its_ca_and_password(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """rediss:// with ``tls_ca_file`` and a password: the shared gate grants over TLS."""
    with RedisProcess.running(password="s3cret", tls=True) as server:
        assert server.url.startswith("rediss://")
        config = replace(
            make_config([sim_backend(sim)]),
            cluster=ClusterConfig(server.url, tls_ca_file=server.ca_file, replica_id="tls"),
        )
        fairq = await fairq_factory(config)
        cluster = fairq.core.cluster
        assert cluster is not None
        await until(lambda: cluster.connected, what="the replica on the shared gate")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fairq.port}") as channel:
            outcome = await run_call(generate(channel, gen_request()))
        assert outcome.code is grpc.StatusCode.OK, outcome
        granted = cluster.metrics.reservations.labels("sim-a", "granted")._value.get()
        assert granted == 1


async def test_a_tls_redis_with_an_unknown_ca_is_refused_and_the_replica_runs_alone(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """A certificate the replica cannot verify is never trusted: it forwards on its local share."""
    with RedisProcess.running(tls=True) as server:
        config = replace(
            make_config([sim_backend(sim)]),
            cluster=ClusterConfig(server.url, replica_id="tls", local_share=0.5),
        )  # no tls_ca_file: the system CAs, which did not sign this server
        fairq = await fairq_factory(config)
        cluster = fairq.core.cluster
        assert cluster is not None and not cluster.connected
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fairq.port}") as channel:
            outcome = await run_call(generate(channel, gen_request()))
        assert outcome.code is grpc.StatusCode.OK, outcome
        assert cluster.metrics.redis_errors._value.get() >= 1


async def test_a_wrong_redis_password_is_said_plainly(caplog: pytest.LogCaptureFixture) -> None:
    """Not an outage: an error naming the credentials at start, and its own metric state."""
    from prometheus_client import CollectorRegistry

    from fairq_server.cluster.node import ClusterNode

    with RedisProcess.running(password="s3cret") as server:
        bare = f"127.0.0.1:{server.port}/0"
        for url, state in (
            (f"redis://:wrong@{bare}", "credentials_refused"),
            (f"redis://{bare}", "credentials_refused"),  # no password at all
            (server.url, "up"),
        ):
            caplog.clear()
            registry = CollectorRegistry()
            node = ClusterNode(ClusterConfig(url, replica_id="t"), registry)
            await node.start()
            try:
                states = {
                    s: registry.get_sample_value("fairq_cluster_redis_state", {"state": s})
                    for s in ("up", "unreachable", "credentials_refused")
                }
                assert states == {s: float(s == state) for s in states}
                errors = [r for r in caplog.records if r.levelname == "ERROR"]
                if state == "up":
                    assert node.connected and not errors
                    continue
                assert not node.connected
                assert registry.get_sample_value("fairq_cluster_redis_up") == 0
                # One error at start (not one per failed beat), naming the problem and the
                # keys to fix; the password itself is not logged.
                [error] = errors
                message = error.getMessage()
                assert "refused fairq's credentials" in message
                assert "password_env" in message and "wrong" not in message
                assert not any("unreachable" in r.getMessage() for r in caplog.records)
                await node.heartbeat()
                assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
            finally:
                await node.close()
