"""Replica views in Redis: published with an expiry, read back, bad entries skipped."""

from __future__ import annotations

import logging

import pytest

from fairq_server.cluster.connection import connect
from fairq_server.config.cluster import ClusterConfig
from fairq_server.console.render import fragment
from fairq_server.observe.live import LiveView, ModelRow, UserRow
from fairq_server.observe.replicas import MAX_VIEW_BYTES, ReplicaViews
from fairq_server.tenancy.standing import LimitRow, TeamRow


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


async def test_limits_survive_redis_and_the_console_shows_a_teams_highest_use(
    redis_url: str,
) -> None:
    """Two replicas' books saw a team's counter at different moments: the higher one shows."""
    client = connect(ClusterConfig(redis_url, replica_id="t"))

    def view(replica: str, used: float) -> LiveView:
        state = "over" if used >= 10 else ""
        until = 1_800_003_600.0 if state else None
        ops = LimitRow("team", "ops", "tokens_per_day", "", "hard", used, 10.0, state, until)
        soft = LimitRow("user", "ann", "tokens_per_minute", "", "soft", 9.0, 5.0, "over")
        row = UserRow("batch", "ann", "research", 1, 0, 0.5, 1.0, 0.2, 0.5, "", 0, 3.0, [soft])
        return LiveView(
            replica, 0.0, ["batch"], [ModelRow("sim", [("batch", 1)], 1, [row])],
            teams=[TeamRow("ops", 1.0, [ops])],
        )  # fmt: skip

    try:
        one = ReplicaViews(client, "fq", "r1", ttl_seconds=3)
        two = ReplicaViews(client, "fq", "r2", ttl_seconds=3)
        await one.publish(view("r1", 4.0).to_json())
        await two.publish(view("r2", 12.0).to_json())
        views = await one.read()
        assert [v["teams"][0]["limits"][0]["used"] for v in views] == [4.0, 12.0]
        html = fragment("queues", views, "r1")
        # One row for the team, from the replica that saw the most (and so its refusal's end).
        assert html.count('data-team="ops"') == 1
        assert '<tr data-team="ops" data-state="over">' in html
        assert "12 / 10 (120%)" in html and "refused until 2027-01-15 09:00:00 UTC" in html
        # Each replica's waiting user keeps its limits through JSON.
        assert html.count("over quota — idle-only band") == 2
    finally:
        await client.aclose()
