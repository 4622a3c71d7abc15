"""Counter policies in a cluster: the journal, adopting shared counters, the global floor."""

from __future__ import annotations

from fairq_server.scheduling.fairness import RoundRobinFairness, VtcFairness
from fairq_server.scheduling.fairness.counter import Journal, PeerHeads
from fairq_server.scheduling.interfaces import Cost


def test_without_a_journal_nothing_is_recorded_and_everyone_may_be_served() -> None:
    policy = VtcFairness()
    policy.activate("a", 1.0)
    policy.charge("a", Cost(prompt_tokens=10))
    assert policy.journal is None
    assert policy.may_serve("a")


def test_charges_and_lifts_are_journaled_weighted() -> None:
    policy = VtcFairness()
    policy.journal = Journal()
    policy.activate("a", 2.0)
    policy.charge("a", Cost(prompt_tokens=10, completion_tokens=5))  # (10 + 2 * 5) / 2
    policy.activate("b", 1.0)  # lifted to a's counter, 10
    journal, active, heads = policy.take_journal()
    assert journal.deltas == {"a": 10.0}
    assert journal.floors == {"b": 10.0}
    assert sorted(active) == ["a", "b"]
    assert heads == (("b", 10.0), ("a", 10.0))  # the lifted user goes first at a tie
    assert policy.journal == Journal()  # a fresh one


def test_adopted_counters_add_what_was_journaled_since_and_reorder() -> None:
    policy = RoundRobinFairness()
    policy.journal = Journal()
    policy.activate("a", 1.0)
    policy.activate("b", 1.0)
    policy.take_journal()
    policy.charge("b", Cost(requests=1))  # after the flush: still pending
    policy.adopt({"a": 5.0, "b": 1.0}, PeerHeads())  # another replica served a five times
    assert policy.counter("a") == 5.0 and policy.counter("b") == 2.0
    assert policy.select() == "b"


def test_a_user_above_the_other_replicas_floor_waits() -> None:
    policy = RoundRobinFairness()
    policy.journal = Journal()
    policy.activate("heavy", 1.0)
    policy.adopt({"heavy": 7.0}, PeerHeads((("light", 3.0),)))  # someone elsewhere is at 3
    assert not policy.may_serve("heavy")
    policy.slack = 4.0
    assert policy.may_serve("heavy")
    policy.adopt({"heavy": 7.0}, PeerHeads())  # nobody backlogged elsewhere
    policy.slack = 0.0
    assert policy.may_serve("heavy")


def test_a_new_user_is_lifted_to_the_other_replicas_floor() -> None:
    policy = RoundRobinFairness()
    policy.journal = Journal()
    policy.adopt({}, PeerHeads((("elsewhere", 42.0),)))
    policy.activate("new", 1.0)
    assert policy.counter("new") == 42.0


def test_a_user_is_not_held_back_by_its_own_counter_on_another_replica() -> None:
    """The same user queued on two replicas: its older counter there is no floor for it,
    but the runner-up there is."""
    policy = RoundRobinFairness()
    policy.journal = Journal()
    policy.activate("power", 1.0)
    policy.adopt({"power": 9.0}, PeerHeads((("power", 5.0),)))
    assert policy.may_serve("power")
    policy.adopt({"power": 9.0}, PeerHeads((("power", 5.0), ("light", 7.0))))
    assert not policy.may_serve("power")
    policy.slack = 2.0
    assert policy.may_serve("power")


def test_the_heads_are_the_two_smallest_backlogged_users() -> None:
    policy = RoundRobinFairness()
    policy.journal = Journal()
    assert policy.take_journal()[2] == ()
    for user in ("a", "b", "c"):
        policy.activate(user, 1.0)
    policy.charge("a", Cost(requests=3))
    policy.charge("b", Cost(requests=1))
    policy.charge("c", Cost(requests=2))
    assert policy.take_journal()[2] == (("b", 1.0), ("c", 2.0))
    assert policy.select() == "b"  # looking under the top left the order intact
    policy.deactivate("b")
    policy.deactivate("a")
    assert policy.take_journal()[2] == (("c", 2.0),)


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


def test_a_users_record_outlives_an_empty_replica_in_a_cluster() -> None:
    """Charges of requests still in flight count when the user comes back (not lifted)."""
    for journal, expected in ((Journal(), 70.0), (None, 10.0)):
        policy = VtcFairness()
        policy.journal = journal
        policy.activate("a", 1.0)
        assert policy.select() == "a"
        policy.charge("a", Cost(prompt_tokens=10))
        policy.deactivate("a")  # its requests are all on the backend: nobody backlogged here
        policy.charge("a", Cost(completion_tokens=30))  # tokens streamed meanwhile
        policy.activate("a", 1.0)  # its next request
        # One process: nobody else to be fair against, the history goes (memory at zero).
        assert policy.counter("a") == expected, journal
