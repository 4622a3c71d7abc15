"""Unit tests of the soft-quota scenario's arithmetic: shares, windows, rates (fast)."""

from __future__ import annotations

import math

import pytest

from fairq_bench.scenarios.soft_quota import rate, share_of, share_series, speed_ratio

DONE = [(0.5, "in1", 30), (0.7, "over", 10), (1.2, "in1", 40), (1.9, "in2", 40), (2.5, "over", 20)]


def test_share_counts_tokens_completed_inside_the_window_only() -> None:
    assert share_of(DONE, "over", 0.0, 1.0) == pytest.approx(10 / 40)
    assert share_of(DONE, "over", 1.0, 2.0) == 0.0
    assert share_of(DONE, "over", 0.0, 3.0) == pytest.approx(30 / 140)
    # The end is open: a completion exactly at t1 belongs to the next window.
    assert share_of(DONE, "in1", 0.5, 1.2) == pytest.approx(30 / 40)


def test_share_of_an_empty_window_is_nan_not_zero() -> None:
    assert math.isnan(share_of(DONE, "over", 3.0, 4.0))


def test_share_series_covers_whole_windows_up_to_the_end() -> None:
    series = share_series(DONE, "over", 1.0, 2.5)
    assert [end for end, _ in series] == [1.0, 2.0]
    assert series[0][1] == pytest.approx(0.25)
    assert series[1][1] == 0.0


def test_rate_is_tokens_per_second_inside_the_window() -> None:
    assert rate(DONE, 1.0, 2.0) == pytest.approx(80.0)
    assert rate(DONE, 0.0, 4.0) == pytest.approx(140 / 4)


def test_speed_ratio_compares_medians_so_one_slow_round_does_not_decide() -> None:
    assert speed_ratio([100.0, 101.0, 10.0], [100.0, 100.0, 100.0]) == pytest.approx(1.0)
    assert speed_ratio([50.0, 50.0, 50.0], [100.0, 90.0, 110.0]) == pytest.approx(0.5)
