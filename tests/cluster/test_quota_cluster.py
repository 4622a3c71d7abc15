"""The Redis limit book in a cluster: one round trip with the slot claim, Redis restarted."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio.connection import AbstractConnection

from fairq_bench.redis_process import RedisProcess
from fairq_server.cluster.connection import run_scripts
from fairq_server.cluster.node import ClusterNode
from fairq_server.config.cluster import ClusterConfig
from fairq_server.tenancy.books.book import Grant, LimitUse, Refusal, Window
from fairq_server.tenancy.books.cluster import ClusterBook, Ride
from fairq_server.tenancy.books.redis import RedisBook
from tests.cluster.quota_helpers import CountingBook, books, tpm


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the writes to Redis connections: one per round trip (a pipeline is one)."""
    sent = [0]
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        sent[0] += 1
        await original(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return sent


async def test_the_quota_reservation_rides_in_the_slot_claims_round_trip(
    redis_url: str, sends: list[int]
) -> None:
    node = ClusterNode(ClusterConfig(redis_url, replica_id="a"), CollectorRegistry())
    book = RedisBook(node.client, "fairq", CountingBook())
    try:
        uses = [LimitUse(tpm("ann"), 100, 1000)]
        # Warm: the connection is open and both scripts loaded, as in service.
        await book.reserve(uses, time.time())
        assert await node.reserve("sim", "a|0", lambda peers: True)
        before = sends[0]
        call, read = book.reserve_call(uses)
        replies: list[Any] = []
        assert await node.reserve("sim", "a|1", lambda peers: True, [call], replies)
        assert sends[0] - before == 1  # the claim and the reservation together
        grant = read(replies[0])
        assert isinstance(grant, Grant) and grant.used == (200,)
        assert (await node.gate.counts(["sim"]))["sim"].in_flight == 2
    finally:
        await node.client.aclose()


@pytest.mark.parametrize("loaded", ["gate", "quota"])
async def test_a_script_redis_lost_is_sent_again_alone(redis_url: str, loaded: str) -> None:
    """After a restart that kept one script (another replica loaded it), the call that ran
    is not run twice: the claim is not counted twice, nor the reservation."""
    node = ClusterNode(ClusterConfig(redis_url, replica_id="a"), CollectorRegistry())
    book = RedisBook(node.client, "fairq", CountingBook())
    try:
        uses = [LimitUse(tpm("ann"), 100, 1000)]
        call, read = book.reserve_call(uses)
        await node.client.script_flush()
        await node.client.script_load(
            node.gate._reserve.script if loaded == "gate" else call[0].script
        )
        replies: list[Any] = []
        assert await node.reserve("sim", "a|1", lambda peers: peers == (0, 0), [call], replies)
        assert isinstance(read(replies[0]), Grant)
        assert await book.used([tpm("ann")], time.time()) == [100]
        assert (await node.gate.counts(["sim"]))["sim"].in_flight == 1
    finally:
        await node.client.aclose()


async def test_redis_restarted_midway(redis_server: RedisProcess) -> None:
    key = tpm("bea", window=Window.DAY)  # one bucket all day: a stale settlement would meet it
    async with books(redis_server.url, 1, share=0.5) as [(book, local, failures)]:
        first = await book.reserve([LimitUse(key, 100, 1000)], time.time())
        assert isinstance(first, Grant)
        redis_server.stop()
        # Unreachable: granted by the one-process book on the local share, Redis's loss told.
        down = await book.reserve([LimitUse(key, 300, 1000)], time.time())
        assert isinstance(down, Grant) and local.limits_seen == [500]
        assert failures
        assert isinstance(await book.reserve([LimitUse(key, 300, 1000)], time.time()), Grant)
        refused = await book.reserve([LimitUse(key, 300, 1000)], time.time())
        assert isinstance(refused, Refusal) and refused.used == 600
        assert refused.use == LimitUse(key, 300, 1000)  # the limit as configured, not scaled
        await book.settle(first, [0])  # Redis down: counted, the reservation stays
        assert book.settle_failures._value.get() == 1
        await book.settle(down, [50])  # where it was granted
        assert local.sums[key] == 350
        redis_server.start()
        again = await book.reserve([LimitUse(key, 40, 1000)], time.time())
        assert isinstance(again, Grant) and again.used == (40,)  # an empty Redis
        # A grant from before the restart gives nothing back from the new count.
        await book.settle(first, [0])
        assert await book.used([key], time.time()) == [40]
        await book.settle(again, [10])
        assert await book.used([key], time.time()) == [10]


async def test_a_replica_that_knows_redis_is_lost_does_not_wait_for_it(
    redis_server: RedisProcess,
) -> None:
    async with books(redis_server.url, 1) as [(book, local, _)]:
        book._available = lambda: False
        redis_server.stop()
        started = time.perf_counter()
        assert isinstance(await book.reserve([LimitUse(tpm("cy"), 1, 10)], time.time()), Grant)
        assert await book.used([tpm("cy")], time.time()) == [1]
        assert time.perf_counter() - started < 0.2  # no connection timeout (0.5 s) waited
        assert local.sums == {tpm("cy"): 1}


async def _sent(book: ClusterBook, grant: Grant | Refusal) -> Ride:
    """The grant's Redis call sent (as the slot claim's pipeline sends it)."""
    assert isinstance(grant, Grant)
    ride = book.ride(grant)
    assert ride is not None
    ride.replies.extend(await run_scripts(book.shared._client, ride.calls))
    return ride


async def test_the_cluster_book_decides_in_redis_and_remembers_refusals(redis_url: str) -> None:
    async with books(redis_url, 2) as [(a, local_a, _), (b, local_b, _)]:
        one, two = ClusterBook(a), ClusterBook(b)
        day = tpm("dee", window=Window.DAY)
        now = time.time()
        # Provisional in the loop; nothing is counted until Redis is asked.
        grant = one.reserve_now([LimitUse(day, 60, 100)], now)
        assert isinstance(grant, Grant)
        assert await a.used([day], now) == [0]
        assert await one.confirm(await _sent(one, grant), now)
        assert one.used_now([day], now) == [60]
        # The other replica does not know yet; Redis refuses its second reservation.
        first = two.reserve_now([LimitUse(day, 60, 100)], now)
        assert await two.confirm(await _sent(two, first), now)
        late = two.reserve_now([LimitUse(day, 60, 100)], now)
        assert not await two.confirm(await _sent(two, late), now)
        # ... and remembers the refusal: the dispatcher's next try is refused at once.
        again = two.reserve_now([LimitUse(day, 1, 100)], now + 1)
        assert isinstance(again, Refusal) and again.used == 120 and again.retry_after > 0
        # Settled while Redis was answering (an abort): settled as the answer arrives.
        third = one.reserve_now([LimitUse(tpm("eve"), 50, 100)], now)
        assert isinstance(third, Grant)
        ride = await _sent(one, third)
        one.settle_now(third, [5], now)
        assert await one.confirm(ride, now)
        await one.close()
        assert await a.used([tpm("eve")], time.time()) == [5]
        two.settle_now(first, [10], now)
        await two.close()
        assert await a.used([day], time.time()) == [70]
        assert local_a.sums == local_b.sums == {}  # all of it decided in Redis
