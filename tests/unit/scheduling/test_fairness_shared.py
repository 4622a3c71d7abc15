"""Counter policies in a cluster: the journal, adopting shared counters, the global floor.

The policies keep their counters in the tier's service counters; in a cluster those are
:class:`JournaledCounters`. The tier queue tells them who is backlogged (here: ``activate``).
"""

from __future__ import annotations

from fairq_server.scheduling.counters import Journal, JournaledCounters, LocalCounters, PeerHeads
from fairq_server.scheduling.fairness import CounterFairness, RoundRobinFairness, VtcFairness
from fairq_server.scheduling.interfaces import Cost


def activate(policy: CounterFairness, counters: LocalCounters, user: str, weight: float) -> None:
    """Activate ``user`` as the tier queue does: the policy, then the counters."""
    policy.activate(user, weight)
    counters.backlogged(user, True)


def test_without_a_cluster_nothing_is_journaled_and_everyone_may_be_served() -> None:
    counters = LocalCounters()
    policy = VtcFairness(counters)
    activate(policy, counters, "a", 1.0)
    policy.charge("a", Cost(prompt_tokens=10))
    assert counters.take_journal() is None
    assert counters.may_serve("a")
    assert counters.get("a") == 10.0  # the policy's counter lives in the counters


def test_charges_and_lifts_are_journaled_weighted() -> None:
    counters = JournaledCounters()
    policy = VtcFairness(counters)
    activate(policy, counters, "a", 2.0)
    policy.charge("a", Cost(prompt_tokens=10, completion_tokens=5))  # (10 + 2 * 5) / 2
    activate(policy, counters, "b", 1.0)  # lifted to a's counter, 10
    journal, active, heads, _members = counters.take_journal()
    assert journal.deltas == {"a": 10.0}
    assert journal.floors == {"a": 0.0, "b": 10.0}  # every lift, a new record's start too
    assert sorted(active) == ["a", "b"]
    assert heads == (("a", 10.0), ("b", 10.0))
    assert counters.journal == Journal()  # a fresh one


def test_a_newcomer_lifted_to_the_last_user_served_reaches_the_cluster() -> None:
    """Issue 33: a's requests all run in the backend (a is not backlogged) when b arrives.

    b starts at the virtual time, a's counter. That start was not journaled (a new record),
    so Redis kept b at 0 plus its charges, adopted back: a got nothing until b caught up.
    """
    counters = JournaledCounters()
    policy = VtcFairness(counters)
    activate(policy, counters, "a", 1.0)
    assert policy.select() == "a"
    policy.charge("a", Cost(prompt_tokens=5000))
    assert policy.select() == "a"  # the virtual time reaches a's counter
    policy.deactivate("a")
    counters.backlogged("a", False)
    counters.take_journal()
    activate(policy, counters, "b", 1.0)
    journal, *_ = counters.take_journal()
    assert journal.floors == {"b": 5000.0}
    # Redis keeps the larger of its value and the floor, plus the charges since: b stays
    # level with a instead of falling to its own charges.
    counters.adopt({"b": max(0.0, journal.floors["b"]) + 48.0}, PeerHeads())
    assert counters.get("b") == 5048.0


def test_a_forgotten_shared_counter_is_not_brought_back_by_a_stale_record() -> None:
    """A record kept here for a user Redis forgot (idle in the whole cluster) is no standing:
    the user's lift is journaled as a floor, and what Redis answers is what it has."""
    counters = JournaledCounters()
    policy = VtcFairness(counters)
    activate(policy, counters, "a", 1.0)
    policy.charge("a", Cost(prompt_tokens=900))
    activate(policy, counters, "b", 1.0)  # lifted to a's 900
    policy.charge("b", Cost(prompt_tokens=100))
    policy.charge("a", Cost(prompt_tokens=500))
    policy.deactivate("a")  # parked here at 1400, above b's 1000
    counters.backlogged("a", False)
    counters.take_journal()
    activate(policy, counters, "a", 1.0)
    journal, *_ = counters.take_journal()
    assert journal.floors["a"] == 1000.0  # the floor: b's counter
    counters.adopt({"a": max(0.0, journal.floors["a"])}, PeerHeads())  # Redis forgot a
    assert counters.get("a") == 1000.0


def test_adopted_counters_add_what_was_journaled_since_and_reorder() -> None:
    counters = JournaledCounters()
    policy = RoundRobinFairness(counters)
    activate(policy, counters, "a", 1.0)
    activate(policy, counters, "b", 1.0)
    counters.take_journal()
    policy.charge("b", Cost(requests=1))  # after the flush: still pending
    counters.adopt({"a": 5.0, "b": 1.0}, PeerHeads())  # another replica served a five times
    assert policy.counter("a") == 5.0 and policy.counter("b") == 2.0
    assert policy.select() == "b"


def test_a_user_above_the_other_replicas_floor_waits() -> None:
    for slack, waits in ((0.0, True), (4.0, False)):
        counters = JournaledCounters(slack=slack)
        policy = RoundRobinFairness(counters)
        activate(policy, counters, "heavy", 1.0)
        counters.adopt({"heavy": 7.0}, PeerHeads((("light", 3.0),)))  # someone elsewhere at 3
        assert counters.may_serve("heavy") is not waits, slack
        counters.adopt({"heavy": 7.0}, PeerHeads())  # nobody backlogged elsewhere
        assert counters.may_serve("heavy")


def test_a_new_user_is_lifted_to_the_other_replicas_floor() -> None:
    counters = JournaledCounters()
    policy = RoundRobinFairness(counters)
    counters.adopt({}, PeerHeads((("elsewhere", 42.0),)))
    activate(policy, counters, "new", 1.0)
    assert policy.counter("new") == 42.0


def test_a_user_is_not_held_back_by_its_own_counter_on_another_replica() -> None:
    """The same user queued on two replicas: its older counter there is no floor for it,
    but the runner-up there is."""
    for slack, waits in ((0.0, True), (2.0, False)):
        counters = JournaledCounters(slack=slack)
        policy = RoundRobinFairness(counters)
        activate(policy, counters, "power", 1.0)
        counters.adopt({"power": 9.0}, PeerHeads((("power", 5.0),)))
        assert counters.may_serve("power")
        counters.adopt({"power": 9.0}, PeerHeads((("power", 5.0), ("light", 7.0))))
        assert counters.may_serve("power") is not waits, slack


def test_the_heads_are_the_two_smallest_backlogged_users() -> None:
    counters = JournaledCounters()
    policy = RoundRobinFairness(counters)
    assert counters.take_journal()[2] == ()
    for user in ("a", "b", "c"):
        activate(policy, counters, user, 1.0)
    policy.charge("a", Cost(requests=3))
    policy.charge("b", Cost(requests=1))
    policy.charge("c", Cost(requests=2))
    assert counters.take_journal()[2] == (("b", 1.0), ("c", 2.0))
    assert policy.select() == "b"
    for user in ("b", "a"):
        policy.deactivate(user)
        counters.backlogged(user, False)
    assert counters.take_journal()[2] == (("c", 2.0),)


def test_peer_heads_floor_skips_the_asking_user() -> None:
    heads = PeerHeads((("a", 1.0), ("b", 4.0), ("a", 0.5), ("c", 2.0)))
    assert heads.floor() == 0.5
    assert heads.floor("a") == 2.0
    assert heads.floor("c") == 0.5
    assert PeerHeads((("a", 1.0),)).floor("a") is None


def test_a_refused_request_coming_back_keeps_its_users_standing() -> None:
    """The cluster's shared gate refused the only queued request of the user furthest behind:
    its charge is refunded and it comes back without a lift (a lift would cost it the whole
    lead of everyone else, at random, every time a reservation loses a race)."""
    for resume, expected in ((True, 0.0), (False, 100.0)):
        policy = VtcFairness()
        policy.activate("a", 1.0)
        policy.activate("b", 1.0)
        policy.charge("b", Cost(prompt_tokens=100))
        assert policy.select() == "a"
        policy.charge("a", Cost(prompt_tokens=10))  # dispatched, and its queue is empty
        policy.deactivate("a")
        policy.charge("a", Cost(prompt_tokens=-10))  # refused: refunded
        policy.activate("a", 1.0, resume=resume)
        assert policy.counter("a") == expected


def test_a_refund_to_a_user_with_more_queued_reorders_it_at_once() -> None:
    """A refused dispatch of a user with more requests queued: the refund lowers its counter
    while it stays backlogged. It must go before users it is now ahead of; in a cluster a stale
    order made each replica pick a user above the other's floor, and both waited for ever."""
    for policy in (RoundRobinFairness(), VtcFairness()):
        for user in ("a", "b"):
            policy.activate(user, 1.0)
        cost = Cost(requests=1, prompt_tokens=10)
        policy.charge("a", cost)
        assert policy.select() == "b"  # a's entry now sits at its charged counter
        policy.charge("b", cost)
        policy.charge("b", cost)
        assert policy.select() == "a"  # b's entry now sits at two charges
        policy.charge("b", Cost(requests=-2, prompt_tokens=-20))  # refunded, still backlogged
        assert policy.counter("b") < policy.counter("a")
        assert policy.select() == "b"
        assert policy.candidates(0.0, 2) == ["b"]


def test_a_users_record_outlives_an_empty_replica_in_a_cluster() -> None:
    """Charges of requests still in flight count when the user comes back (not lifted)."""
    for counters, expected in ((JournaledCounters(), 70.0), (LocalCounters(), 10.0)):
        policy = VtcFairness(counters)
        policy.activate("a", 1.0)
        assert policy.select() == "a"
        policy.charge("a", Cost(prompt_tokens=10))
        policy.deactivate("a")  # its requests are all on the backend: nobody backlogged here
        policy.charge("a", Cost(completion_tokens=30))  # tokens streamed meanwhile
        policy.activate("a", 1.0)  # its next request
        # One process: nobody else to be fair against, the history goes (memory at zero).
        assert policy.counter("a") == expected, counters
