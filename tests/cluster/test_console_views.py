"""Replica views in Redis: published with an expiry, read back, bad entries skipped."""

from __future__ import annotations

import logging

import pytest

from fairq_server.cluster.connection import connect
from fairq_server.cluster.settings import ClusterConfig
from fairq_server.observe.replicas import MAX_VIEW_BYTES, ReplicaViews


async def test_views_round_trip_expire_and_skip_what_is_not_a_view(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = connect(ClusterConfig(redis_url, replica_id="t"))
    try:
        one = ReplicaViews(client, "fq", "r1", ttl_seconds=3)
        two = ReplicaViews(client, "fq", "r2", ttl_seconds=3)
        await one.publish({"replica": "r1", "models": []})
        await two.publish({"replica": "r2", "models": []})
        assert 0 < await client.ttl("fq:console:r1") <= 3
        # Whatever else sits under the prefix is skipped, with a line for what is not JSON.
        await client.set("fq:console:junk", b"\xff not json")
        await client.set("fq:console:list", b"[1, 2]")
        with caplog.at_level(logging.WARNING):
            views = await one.read()
        assert [v["replica"] for v in views] == ["r1", "r2"]
        assert "fq:console:junk holds no JSON view" in caplog.text
        # A view too large to publish whole keeps its counts and loses user rows past five.
        rows = [{"user": f"u{i}", "pad": "x" * 1000} for i in range(MAX_VIEW_BYTES // 1000)]
        await one.publish({"replica": "r1", "models": [{"model": "m", "users": 600, "rows": rows}]})
        [big] = [v for v in await one.read() if v["replica"] == "r1"]
        assert big["models"][0]["users"] == 600 and len(big["models"][0]["rows"]) == 5
    finally:
        await client.aclose()


async def test_a_redis_that_does_not_answer_costs_one_refresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = connect(ClusterConfig("redis://127.0.0.1:1", replica_id="t"))
    views = ReplicaViews(client, "fq", "r1", ttl_seconds=3)
    with caplog.at_level(logging.WARNING):
        await views.publish({"replica": "r1"})
        assert await views.read() == []
    assert caplog.text.count("Redis unreachable for the cluster view") == 1  # logged once
    await client.aclose()
