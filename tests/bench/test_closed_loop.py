"""The closed-loop benchmark's arithmetic: owed shares, windows and engine efficiency."""

from __future__ import annotations

import pytest

from fairq_bench.closed_loop.efficiency import efficiency
from fairq_bench.closed_loop.mixes import MIXES, Caller, Mix, fair_shares, max_min
from fairq_bench.closed_loop.runner import Done, Run


def mix(key: str) -> Mix:
    return next(m for m in MIXES if m.key == key)


def test_max_min_fills_the_small_demands_first_then_splits_by_weight() -> None:
    got = max_min({"a": 1.0, "b": 8.0, "c": 8.0}, {"a": 1.0, "b": 1.0, "c": 2.0}, 7.0)
    assert got == pytest.approx({"a": 1.0, "b": 2.0, "c": 4.0})
    assert max_min({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, 4.0) == {"a": 1.0, "b": 1.0}


def test_owed_shares_of_the_issue_mixes() -> None:
    assert mix("chat").fair_shares(4) == pytest.approx(
        dict.fromkeys(["chat1", "chat2", "chat3", "deep"], 0.25)
    )
    for k in (1, 2, 4, 8):
        assert mix(f"short-long-{k}").fair_shares(4) == pytest.approx({"short": 0.5, "long": 0.5})
    teams = mix("teams-2").fair_shares(4)
    assert teams["red1"] == pytest.approx(0.375) and teams["blue1"] == pytest.approx(1 / 12)
    assert mix("weights-4").fair_shares(4) == pytest.approx({"heavy": 2 / 3, "light": 1 / 3})
    # A team that wants less than its weight's part leaves the rest to the other.
    small = (Caller("r", 1, 48, team="red"), Caller("b", 8, 48, team="blue"))
    assert fair_shares(small, {"red": 3.0, "blue": 1.0}, 4) == pytest.approx({"r": 0.25, "b": 0.75})


def test_tokens_are_spread_over_each_request_and_windows_split_them() -> None:
    m = Mix("m", "", (Caller("a", 1, 100), Caller("b", 1, 100)))
    run = Run(m, "fairq", 10.0, done=[Done("a", 0.0, 0.0, 4.0, 100), Done("b", 2.0, 2.0, 6.0, 100)])
    assert run.tokens(0.0, 2.0) == pytest.approx({"a": 50.0, "b": 0.0})
    assert run.shares(2.0, 4.0) == pytest.approx({"a": 0.5, "b": 0.5})
    assert run.throughput(0.0, 10.0) == pytest.approx(20.0)
    # Engine-seconds of the tokens at 100 tokens/s, over the 10 s: 2 s busy of 10.
    assert efficiency(run, {100: 100.0}, 0.0) == pytest.approx(0.2)
