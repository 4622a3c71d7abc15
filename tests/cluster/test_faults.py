"""Cluster faults at reduced size, against a real redis-server and real fairq processes.

Each scenario is the benchmark's (:mod:`fairq_bench.cluster.faults`): nothing lost on
the surviving replicas, and the backend queue never far above the tier threshold.
"""

from __future__ import annotations

import math

import pytest

from fairq_bench.cluster.faults import THRESHOLD, scenario
from fairq_bench.redis_process import redis_server_path

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    if redis_server_path() is None:
        pytest.fail("redis-server is not installed: apt-get install -y redis-server")


async def test_kill_9_a_replica_mid_flood() -> None:
    r = await scenario("kill", quick=True)
    assert r.survivor_errors == 0, r
    assert r.target_errors > 0, r  # its own callers see the replica gone (UNAVAILABLE)
    # Its slots leave Redis within a lease (+ the heartbeat's third and margin).
    assert r.slots_freed_seconds <= 2 * r.lease_seconds, r
    assert r.peak_waiting <= THRESHOLD + 1, r


async def test_redis_stopped_and_restarted_empty() -> None:
    r = await scenario("redis", quick=True)
    assert r.survivor_errors == 0 and r.target_errors == 0, r
    assert not math.isnan(r.recovered_seconds), r  # every replica back on the shared gate
    # On the local share (half the threshold each, at least 1) the two replicas stay near it
    # too: a reservation Redis did not answer is admitted again on that share, and the other
    # replica's last counts stand until a scrape sees its requests (measured: the threshold
    # in 10 of 10 runs; + 1 for a scrape landing late on a loaded machine).
    assert r.peak_waiting <= THRESHOLD + 1, r
    assert r.started_after > 0, r  # the gate was seen at work after the restart
    assert r.peak_after <= THRESHOLD, r


async def test_sigstop_a_replica_longer_than_a_lease() -> None:
    r = await scenario("sigstop", quick=True)
    assert r.survivor_errors == 0 and r.target_errors == 0, r  # it finishes after SIGCONT
    assert r.slots_freed_seconds <= 2 * r.lease_seconds, r
    assert not math.isnan(r.recovered_seconds), r
    # The stop comes as the target holds its first slots: requests it reserved but had not
    # sent go out on SIGCONT, after their leases ran out and the other replica reused the
    # slots (measured on a busy machine: 3 + 1 and 3 + 2, each time that many sent within
    # a few ms before the stop). A lease cannot hold them back; they are bounded by the
    # target's reservations at the stop (+ 1: the survivor's scrape lagging the expiry).
    assert r.peak_waiting <= THRESHOLD + 1 + r.held_at_fault, r
    # Once they have started, the gate holds the threshold again (+ 1: the survivor's scrape
    # lagging the settle; measured 4 once in 5 full runs on a loaded machine, 3 otherwise).
    assert r.settled_seconds < 10 * r.lease_seconds, r
    assert r.started_after > 0 and r.peak_after <= THRESHOLD + 1, r
