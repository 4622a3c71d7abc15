"""The Redis side of the cluster against a real server: the gate's release announcements,
the fairness heads, and scripts that Redis lost in a restart."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from fairq_bench.redis_process import RedisProcess
from fairq_server.cluster.connection import connect, run_scripts
from fairq_server.cluster.fairness import SharedCounters
from fairq_server.cluster.shared_gate import GlobalCounts, SharedGate, parse_announcement
from fairq_server.config.cluster import ClusterConfig
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.counters import Journal, PeerHeads


@contextlib.asynccontextmanager
async def _gate(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, SharedGate]]:
    """Replica ``a``'s client and shared gate (key prefix ``t``), the client closed after."""
    client = connect(ClusterConfig(redis_url, replica_id="a"))
    try:
        yield client, SharedGate(client, "t", lease_seconds=5.0)
    finally:
        await client.aclose()


async def test_a_release_announces_the_counts_it_leaves(redis_url: str) -> None:
    listener = connect(ClusterConfig(redis_url, replica_id="b"))
    pubsub = listener.pubsub(ignore_subscribe_messages=True)
    try:
        async with _gate(redis_url) as (_, gate):
            await pubsub.psubscribe(gate.channel())
            for member in ("a|1", "a|2"):
                granted, _ = await gate.reserve("sim", member, 0.0, threshold=3, cap=0)
                assert granted
            assert await gate.first_token("sim", "a|1") == GlobalCounts(awaiting=1, in_flight=2)
            assert await gate.release("sim", "a|2") == GlobalCounts(awaiting=0, in_flight=1)
            heard = []
            async with asyncio.timeout(5):
                while len(heard) < 2:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        channel, data = message["channel"].decode(), message["data"].decode()
                        heard.append(parse_announcement(channel, data, "t"))
            assert heard == [("sim", GlobalCounts(1, 2)), ("sim", GlobalCounts(0, 1))]
            assert await gate.counts(["sim"]) == {"sim": GlobalCounts(0, 1)}
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await listener.aclose()


def test_announcements_that_are_not_counts_are_ignored() -> None:
    assert parse_announcement("t:gate-released:sim", "2 5", "t") == ("sim", GlobalCounts(2, 5))
    assert parse_announcement("t:gate-released:sim", "a|1", "t") is None  # an older replica
    assert parse_announcement("t:gate-released:sim", "-1 5", "t") is None
    assert parse_announcement("t:fair-heads", "2 5", "t") is None


def _entry(heads: tuple[tuple[str, float], ...], active: list[str]) -> ev.JournalEntry:
    return ev.JournalEntry("m", 0, Journal(deltas={u: c for u, c in heads}), active, heads)


async def test_each_replica_reads_the_other_replicas_heads_not_its_own(redis_url: str) -> None:
    a = connect(ClusterConfig(redis_url, replica_id="a"))
    b = connect(ClusterConfig(redis_url, replica_id="b"))
    try:
        on_a = SharedCounters(a, "t", "a", lease_seconds=5.0)
        on_b = SharedCounters(b, "t", "b", lease_seconds=5.0)
        # A user name with spaces and quotes travels intact.
        odd = 'light "one" two'
        (ra,) = await on_a.sync([_entry(((odd, 3.0), ("power", 9.0)), [odd, "power"])])
        assert ra.heads.pairs == ()
        (rb,) = await on_b.sync([_entry((("power", 9.0),), ["power"])])
        assert sorted(rb.heads.pairs) == [(odd, 3.0), ("power", 9.0)]
        assert rb.heads.floor("power") == 3.0
        assert rb.counters == {"power": 18.0}  # both replicas charged 9
        (ra,) = await on_a.sync([_entry((), [])])  # nobody backlogged on a any more
        (rb,) = await on_b.sync([_entry((("power", 18.0),), ["power"])])
        assert rb.heads.pairs == ()
    finally:
        await a.aclose()
        await b.aclose()


async def test_member_heads_travel_beside_the_heads_and_leave_with_their_replica(
    redis_url: str,
) -> None:
    a = connect(ClusterConfig(redis_url, replica_id="a"))
    b = connect(ClusterConfig(redis_url, replica_id="b"))
    try:
        on_a = SharedCounters(a, "t", "a", lease_seconds=5.0)
        on_b = SharedCounters(b, "t", "b", lease_seconds=5.0)
        members = (("team A", "A.a1", 4.0), ("team A", "A.a3", 6.0), ("team B", "B.b1", 1.0))
        entry = ev.JournalEntry("m", 0, Journal(), ["team A", "A.a1"], (("team A", 2.0),), members)
        (ra,) = await on_a.sync([entry])
        assert ra.heads.members == ()
        (rb,) = await on_b.sync([ev.JournalEntry("m", 0, Journal(), ["A.a2"], (), ())])
        assert rb.heads.pairs == (("team A", 2.0),)
        assert sorted(rb.heads.members) == sorted(members)
        assert rb.heads.member_floor("A.a2", "team A") == 4.0
        assert rb.heads.member_floor("A.a1", "team A") == 6.0  # not its own head on a
        assert rb.counters == {"A.a2": 0.0}
        # Malformed member heads (an older or broken replica) are skipped, not fatal.
        await b.hset("t:fair:m:0:peer-member-heads", "c", "99999999999999 [[1, 2, 3]]")
        await on_a.sync([ev.JournalEntry("m", 0, Journal(), [], (), ())])  # a: none backlogged
        (rb,) = await on_b.sync([ev.JournalEntry("m", 0, Journal(), [], (), ())])
        assert rb.heads == PeerHeads()
    finally:
        await a.aclose()
        await b.aclose()


async def test_scripts_are_loaded_again_after_redis_restarts_empty(
    redis_server: RedisProcess,
) -> None:
    async with _gate(redis_server.url) as (client, gate):
        assert await gate.counts(["x", "y"]) == {"x": GlobalCounts(0, 0), "y": GlobalCounts(0, 0)}
        redis_server.stop()
        redis_server.start()  # empty: no scripts cached
        await gate.renew({"x": {"a|1": True}, "y": {"a|2": True}})  # a pipeline of two calls
        assert await gate.counts(["x", "y"]) == {"x": GlobalCounts(1, 1), "y": GlobalCounts(1, 1)}
        flushed = await client.script_exists(gate._count.sha)
        assert flushed == [True]
        await client.script_flush()
        assert await run_scripts(client, [(gate._count, ["k1", "k2"], [])]) == [[0, 0]]


async def test_renewing_sets_every_member_held_again_after_an_empty_restart(
    redis_server: RedisProcess,
) -> None:
    """The requests a replica still has on the backend are counted again, in the right set."""
    async with _gate(redis_server.url) as (_, gate):
        for member in ("a|1", "a|2"):
            assert (await gate.reserve("sim", member, 0.0, threshold=3, cap=0))[0]
        await gate.first_token("sim", "a|1")
        redis_server.stop()
        redis_server.start()  # empty
        assert await gate.counts(["sim"]) == {"sim": GlobalCounts(0, 0)}
        await gate.renew({"sim": {"a|1": False, "a|2": True, "a|3": True}})  # a|3: local
        assert await gate.counts(["sim"]) == {"sim": GlobalCounts(awaiting=2, in_flight=3)}
        await gate.renew({"sim": {"a|1": False, "a|2": False, "a|3": False}})  # tokens came
        assert (await gate.counts(["sim"]))["sim"].awaiting == 0


async def test_counters_of_users_idle_for_an_hour_are_deleted(redis_url: str) -> None:
    client = connect(ClusterConfig(redis_url, replica_id="a"))
    try:
        counters = SharedCounters(client, "t", "a", lease_seconds=5.0)
        users = [f"u{i}" for i in range(100)]
        journal = Journal(deltas=dict.fromkeys(users, 1.0))
        await counters.sync([ev.JournalEntry("m", 0, journal, [], ())])
        assert await client.hlen("t:fair:m:0:counters") == 100
        # Half of them were last seen over an hour ago (by Redis's clock, as the script
        # stamps them): the next sync, for anyone, deletes their counters.
        seconds, micros = await client.time()
        long_ago = seconds * 1000 + micros // 1000 - 3_600_001
        await client.zadd("t:fair:m:0:seen", {u: long_ago for u in users[:50]})
        fresh = Journal(deltas={"new": 1.0})
        (result,) = await counters.sync([ev.JournalEntry("m", 0, fresh, ["u60"], ())])
        assert result.counters == {"u60": 1.0}
        fields = {f.decode() for f in await client.hkeys("t:fair:m:0:counters")}
        assert fields == {*users[50:], "new"}
        assert await client.zcard("t:fair:m:0:seen") == 51
        assert 0 < await client.pttl("t:fair:m:0:counters") <= 3_600_000
    finally:
        await client.aclose()


async def test_take_over_keeps_a_live_member_in_flight_and_awaiting_again(redis_url: str) -> None:
    async with _gate(redis_url) as (client, gate):
        for member in ("a|1", "a|2"):
            granted, _ = await gate.reserve("sim", member, 0.0, threshold=0, cap=0)
            assert granted
        await gate.first_token("sim", "a|1")
        # a|1 (its request preempted) goes to the preempting request: still in flight, awaiting
        # its first token again; the counts found are the others' (a|2 awaiting, in flight).
        assert await gate.take_over("sim", "a|1") == (GlobalCounts(awaiting=1, in_flight=1), [])
        assert await gate.counts(["sim"]) == {"sim": GlobalCounts(2, 2)}
        # A member Redis no longer holds (released, or its lease ran out) is not taken over.
        await gate.release("sim", "a|2")
        assert await gate.take_over("sim", "a|2") == (None, [])
        await client.zadd("t:gate:sim:flight", {"a|3": 1})  # a lease that ran out long ago
        assert await gate.take_over("sim", "a|3") == (None, [])
        assert await gate.counts(["sim"]) == {"sim": GlobalCounts(1, 1)}


async def test_calls_ride_with_a_hand_over_once_whether_or_not_it_keeps_the_slot(
    redis_url: str,
) -> None:
    """A preempting request's quota reservation goes with the take-over, and is not sent
    again by the claim that follows a hand-over that found the slot gone."""
    async with _gate(redis_url) as (client, gate):
        count = client.register_script("return redis.call('INCR', KEYS[1])")
        ride = [(count, ["t:rides"], [])]
        granted, _ = await gate.reserve("sim", "a|1", 0.0, threshold=0, cap=0)
        assert granted
        counts, replies, kept = await gate.reserve_slot("sim", "a|1", ride, handed=True)
        assert (counts, replies, kept) == (GlobalCounts(0, 0), [1], True)
        await gate.release("sim", "a|1")
        counts, replies, kept = await gate.reserve_slot("sim", "a|1", ride, handed=True)
        assert (replies, kept) == ([2], False)
        assert await gate.counts(["sim"]) == {"sim": GlobalCounts(1, 1)}  # claimed instead
        assert int(await client.get("t:rides")) == 2
        counts, replies, kept = await gate.reserve_slot("sim", "a|2", ride, handed=False)
        assert (replies, kept) == ([3], False)
