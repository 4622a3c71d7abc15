"""Unit tests of the quota scenarios' arithmetic: minute windows, paired medians (fast)."""

from __future__ import annotations

import statistics

import pytest

from fairq_bench.scenarios.quota_cluster import minute_peaks
from fairq_bench.scenarios.quota_cost import bootstrap_median


def test_minute_peaks_counts_sixty_whole_seconds_like_the_book() -> None:
    # 100 tokens at 1000.9 and 100 at 1060.1: 59.2 s apart, but 61 whole seconds (1000..1060)
    # hold them, so the book's window (the 60 whole seconds ending at a grant) never has both.
    granted = [(1000.9, 100), (1060.1, 100)]
    peaks = minute_peaks(granted, 1000.0, 1120.0)
    assert peaks["bucketed"] == 100
    assert peaks["exact"] == 200  # an exact 60 s interval does hold both
    assert peaks["minutes"] == [100, 100]
    assert peaks["rolling"][0] == 100 and peaks["rolling"][59] == 100
    assert peaks["rolling"][60] == 100  # 1000's bucket has left, 1060's has come


def test_minute_peaks_exact_window_is_half_open() -> None:
    granted = [(10.0, 5), (70.0, 7), (69.999, 11)]
    peaks = minute_peaks(granted, 0.0, 120.0)
    assert peaks["exact"] == 18  # 10.0 is out of [10.0+, 70.0]; 69.999 and 70.0 together
    assert peaks["bucketed"] == 18


def test_bootstrap_median_brackets_the_median_and_narrows_with_more_samples() -> None:
    few = [0.1 * (i % 7) - 0.2 for i in range(40)]
    many = few * 25
    med, lo, hi = bootstrap_median(few)
    assert med == statistics.median(few)
    assert lo <= med <= hi
    _, lo_many, hi_many = bootstrap_median(many)
    assert hi_many - lo_many < hi - lo


def test_bootstrap_median_of_a_constant_is_that_constant() -> None:
    assert bootstrap_median([0.25] * 30) == pytest.approx((0.25, 0.25, 0.25))
