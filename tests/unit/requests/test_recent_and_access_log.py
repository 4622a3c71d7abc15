from __future__ import annotations

import json
import math

import pytest

from fairq_server.doors.access_log import RequestTrace, format_line
from fairq_server.observe.recent import RecentService


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_recent_service_decays_with_its_time_constant() -> None:
    clock = Clock()
    recent = RecentService(tau=60.0, clock=clock)
    recent.record("alice", 100)
    clock.now += 60.0
    assert recent.values()["alice"] == pytest.approx(100 / math.e)
    recent.record("alice", 50)  # decayed value plus the new tokens
    assert recent.values()["alice"] == pytest.approx(100 / math.e + 50)


def test_recent_service_steady_rate_reads_rate_times_tau() -> None:
    clock = Clock()
    recent = RecentService(tau=10.0, clock=clock)
    for _ in range(2000):  # 10 tokens every 0.1 s = 100 tokens/s for 200 s
        clock.now += 0.1
        recent.record("u", 10)
    assert recent.values()["u"] == pytest.approx(100 * 10.0, rel=0.06)


def test_recent_service_forgets_faded_users_and_ignores_zero() -> None:
    clock = Clock()
    recent = RecentService(tau=1.0, clock=clock)
    recent.record("gone", 1)
    recent.record("none", 0)
    clock.now += 10.0
    assert recent.values() == {}
    assert len(recent) == 0


def test_recent_service_keeps_the_largest_when_over_its_bound() -> None:
    recent = RecentService(max_users=4, clock=Clock())
    for i in range(1, 6):
        recent.record(f"u{i}", i * 10)
    # Over the bound: pruned to the larger half (2 of 4), the smaller ones dropped.
    assert set(recent.values()) == {"u4", "u5"}


def test_recent_service_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError):
        RecentService(tau=0)
    with pytest.raises(ValueError):
        RecentService(max_users=0)


def test_access_line_has_every_field_and_nulls_for_what_was_not_reached() -> None:
    trace = RequestTrace(request_id="r1", user="alice", group="team-a", tier="batch",
                         model="sim", arrival=10.0)  # fmt: skip
    line = json.loads(format_line(trace, "not_found", 10.5, 1_800_000_000.25))
    assert line == {
        "ts": "2027-01-15T08:00:00.250Z",
        "request_id": "r1",
        "user_group": "team-a",
        "tier": "batch",
        "model": "sim",
        "backend": "",
        "outcome": "not_found",
        "queue_seconds": None,
        "ttft_seconds": None,
        "total_seconds": 0.5,
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }
    assert "alice" not in format_line(trace, "finished", 11.0, 0.0)  # names stay out


def test_access_line_escapes_hostile_input_into_one_line() -> None:
    trace = RequestTrace(request_id='a"\nb', model="m\u2028x", arrival=0.0)
    text = format_line(trace, "invalid_argument", 1.0, 0.0)
    assert len(text.splitlines()) == 1
    assert json.loads(text)["request_id"] == 'a"\nb'
