"""The quota micro-benchmark runs, times every phase and keeps the book's memory bounded."""

from __future__ import annotations

from fairq_bench.entitlement_bench import run


def test_a_short_run_times_each_phase_and_the_book_stays_bounded() -> None:
    # 3,000 requests over 150 s of book time from 200 users: windows roll and sweeps run.
    result = run(requests=3000, users=200, teams=5, rate=20.0)
    for phase in ("admit", "band", "reserve", "settle"):
        assert result[phase] > 0
    assert 0 < result["share"] <= 1.5
    # Per user: requests per minute and the soft tokens per minute; per team: four counters.
    assert result["counters"] <= 200 * 2 + 5 * 4
