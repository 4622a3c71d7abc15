"""Per user and team waits between two samples: summed, taken, and bounded."""

from __future__ import annotations

from fairq_server.tenancy.waits import WaitTally


def test_sums_are_per_user_and_team_and_start_again_when_taken() -> None:
    tally = WaitTally()
    tally.waited("ann", "ops", 1.0)
    tally.waited("ann", "ops", 3.0)
    tally.first_token("ann", "ops", 5.0)
    tally.waited("bob", None, 0.5)
    taken = tally.take()
    assert (taken.users["ann"].wait, taken.users["ann"].waits) == (4.0, 2)
    assert (taken.users["ann"].ttft, taken.users["ann"].firsts) == (5.0, 1)
    assert taken.teams["ops"].weight == 9.0
    assert taken.teams[None].waits == 1
    again = tally.take()
    assert not again.users and not again.teams and again.other_users.waits == 0


def test_users_past_the_bound_are_summed_together() -> None:
    """However many users call in an interval, at most ``tracked`` are kept apart."""
    tally = WaitTally(tracked=3)
    for i in range(1000):
        tally.waited(f"user {i}", f"team {i}", 1.0)
        tally.first_token(f"user {i}", f"team {i}", 2.0)
    taken = tally.take()
    assert sorted(taken.users) == ["user 0", "user 1", "user 2"]
    assert len(taken.teams) == 3
    assert (taken.other_users.waits, taken.other_users.firsts) == (997, 997)
    assert taken.other_teams.ttft == 2.0 * 997
    # A user already kept apart stays apart in the same interval.
    tally.waited("a", None, 1.0)
    tally.waited("b", None, 1.0)
    tally.waited("c", None, 1.0)
    tally.waited("d", None, 1.0)
    tally.waited("a", None, 1.0)
    taken = tally.take()
    assert taken.users["a"].waits == 2 and taken.other_users.waits == 1
