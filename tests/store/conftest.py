"""Store tests: a real PostgreSQL (one per session, a fresh database per test) and SQLite."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairq_bench.postgres_process import INSTALL_HINT, PostgresProcess, postgres_bin_dir

_numbers = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresProcess]:
    """A running PostgreSQL for the session; skips (naming the fix) without its binaries."""
    if postgres_bin_dir() is None:
        pytest.skip(INSTALL_HINT)
    with PostgresProcess.running_server() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresProcess) -> str:
    """A fresh, empty database on :func:`postgres` (restarted if a test stopped it)."""
    if not postgres.running:
        postgres.start()
    return postgres.create_database(f"fairq_test_{next(_numbers)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fairq.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
