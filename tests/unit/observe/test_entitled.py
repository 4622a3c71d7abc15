"""The queue view's judgement: entitlement over the share's window, over and starved, states."""

from __future__ import annotations

import pytest

from fairq_server.observe.entitled import EntitledWindow
from fairq_server.observe.live import (
    HELD_BAND,
    HELD_QUOTA,
    QUEUED,
    RUNNING,
    UserRow,
    _judge,
)
from fairq_server.observe.recent import RecentService
from fairq_server.tenancy.standing import LimitRow


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _row(share: float, entitled: float, **fields: object) -> UserRow:
    values: dict[str, object] = {
        "tier": "batch", "user": "a", "team": "", "queued": 1, "position": 0,
        "waiting_seconds": 30.0, "weight": 1.0, "share": share, "entitled": entitled,
        "status": "", "state": QUEUED,
    }  # fmt: skip
    values.update(fields)
    return UserRow(**values)  # type: ignore[arg-type]


def test_over_does_not_blink_while_contenders_come_and_go() -> None:
    """A served fairly while others come and go: never over, though the moment's part is.

    Each second 300 tokens are shared equally among that second's contenders: a always, b and
    c and d by turns (four, two, three contenders). a's share of the minute is about 36 %,
    the moment's entitlement 25 %, 50 % or 33 %: against the moment a was "over" one reading
    in three (the badge blinked); against the same window it never is.
    """
    clock = Clock()
    recent = RecentService(tau=60.0, clock=clock)
    window = EntitledWindow(recent.tau)
    rounds = [("a", "b", "c", "d"), ("a", "b"), ("a", "b", "c")]
    windowed, moment = [], []
    for second in range(240):
        contenders = rounds[second % 3]
        for user in contenders:
            recent.record(user, 300 // len(contenders))
        clock.now += 1.0
        parts = {u: 1 / len(contenders) for u in contenders}
        window.update(clock.now, recent.total(), parts)
        if second < 120:  # the first two windows: the share's history fills up
            continue
        values = recent.values()
        share = values["a"] / sum(values.values())
        windowed.append(_judge(_row(share, window.entitled("a")), True, 10.0)["status"])
        moment.append(_judge(_row(share, parts["a"]), True, 10.0)["status"])
    assert set(windowed) == {""}
    assert moment.count("over") == 40  # what the view showed before: one reading in three
    assert window.entitled("a") == pytest.approx(values["a"] / sum(values.values()), abs=0.01)


def test_a_user_served_alone_is_owed_what_it_got_and_not_more_once_others_come() -> None:
    clock = Clock()
    recent = RecentService(tau=60.0, clock=clock)
    window = EntitledWindow(recent.tau)
    window.update(clock.now, recent.total(), {"a": 0.5, "b": 0.5})
    assert window.entitled("a") == 0.5  # no service yet: the moment's part
    for _ in range(30):  # a alone
        recent.record("a", 100)
        clock.now += 1.0
        window.update(clock.now, recent.total(), {"a": 1.0})
    assert window.entitled("a") == pytest.approx(1.0, abs=0.01)
    for _ in range(30):  # then a and b, served equally
        recent.record("a", 50)
        recent.record("b", 50)
        clock.now += 1.0
        window.update(clock.now, recent.total(), {"a": 0.5, "b": 0.5})
    values = recent.values()
    share = values["a"] / sum(values.values())
    assert 0.5 < window.entitled("a") < 1.0
    assert window.entitled("a") == pytest.approx(share, abs=0.01)
    assert window.entitled("a") + window.entitled("b") == pytest.approx(1.0)


def test_a_first_reading_or_one_after_a_long_gap_takes_the_moment() -> None:
    window = EntitledWindow(60.0)
    window.update(0.0, 1000.0, {"a": 0.25, "b": 0.75})
    assert (window.entitled("a"), window.entitled("b")) == (0.25, 0.75)
    window.update(500.0, 10.0, {"b": 1.0})  # no reading for longer than the window
    assert (window.entitled("a"), window.entitled("b")) == (0.0, 1.0)


def test_ten_thousand_users_at_zero_are_not_starved() -> None:
    row = _row(0.0, 0.0001, waiting_seconds=60.0)
    assert _judge(row, True, 10.0)["status"] == ""
    short = _row(0.05, 0.25, waiting_seconds=60.0)  # visibly short: starved
    assert _judge(short, True, 10.0)["status"] == "starved"
    assert _judge(_row(0.05, 0.25, waiting_seconds=1.0), True, 10.0)["status"] == ""


def test_a_user_held_by_a_limit_says_so_and_is_not_starved() -> None:
    soft = LimitRow("user", "a", "tokens_per_minute", "", "soft", 9.0, 5.0, "over")
    hard = LimitRow("team", "t", "tokens_per_day", "", "hard", 12.0, 10.0, "over", 2e9)
    near = LimitRow("team", "t", "requests_per_minute", "", "hard", 4.0, 5.0, "warn")
    assert _judge(_row(0.0, 0.5, limits=[soft]), True, 10.0) == {
        "state": HELD_BAND, "status": "",
    }  # fmt: skip
    assert _judge(_row(0.0, 0.5, limits=[soft, hard]), True, 10.0)["state"] == HELD_QUOTA
    assert _judge(_row(0.0, 0.5, limits=[near]), True, 10.0) == {
        "state": QUEUED, "status": "starved",
    }  # fmt: skip
    running = _row(0.9, 0.5, queued=0, position=-1, waiting_seconds=0.0, state=RUNNING)
    assert _judge(running, True, 10.0) == {"state": RUNNING, "status": "over"}
    assert _judge(running, False, 10.0)["status"] == ""  # nobody else contends
