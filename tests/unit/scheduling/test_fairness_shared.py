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
    assert journal.floors == {"b": 10.0}
    assert sorted(active) == ["a", "b"]
    assert heads == (("a", 10.0), ("b", 10.0))
    assert counters.journal == Journal()  # a fresh one


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
