"""The coalescing window's stretch follows the event loop's load, smoothed."""

from __future__ import annotations

import pytest

from fairq_server.runtime.pace import FULL, HALF, MAX_STRETCH, Pace


def settled(load: float) -> float:
    """The stretch after enough samples of one load that the smoothing has caught up."""
    p = Pace()
    for _ in range(50):
        p.observe(load)
    return p.stretch


def test_up_to_half_load_the_window_is_as_configured() -> None:
    assert settled(0.0) == 1.0
    assert settled(HALF) == 1.0


def test_near_capacity_it_is_stretched_to_the_longest() -> None:
    assert settled(FULL) == pytest.approx(MAX_STRETCH)
    assert settled(1.0) == pytest.approx(MAX_STRETCH)
    assert settled(7.0) == pytest.approx(MAX_STRETCH)  # a sample above 1 counts as 1


def test_in_between_it_grows_with_the_load() -> None:
    middle = settled((HALF + FULL) / 2)
    assert middle == pytest.approx((1.0 + MAX_STRETCH) / 2)
    assert 1.0 < settled(0.6) < middle < settled(0.8) < MAX_STRETCH


def test_one_busy_sample_does_not_stretch_it_all_the_way() -> None:
    p = Pace()
    p.observe(1.0)
    assert 1.0 <= p.stretch < MAX_STRETCH
    for _ in range(10):
        p.observe(0.0)
    assert p.stretch == 1.0  # and it comes back when the load is gone


def test_reset_returns_to_the_configured_window() -> None:
    p = Pace()
    p.observe(1.0)
    p.observe(1.0)
    p.reset()
    assert p.stretch == 1.0
    p.observe(HALF + 0.01)  # the smoothing starts again from idle
    assert p.stretch == 1.0
