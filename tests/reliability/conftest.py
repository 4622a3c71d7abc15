"""Reliability tests: the ``slow`` marker for the load and soak runs."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: load and soak runs of a minute or more (deselect with -m 'not slow')"
    )
