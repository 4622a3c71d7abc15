"""Cluster tests: a real ``redis-server`` on a free loopback port, fresh for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fairq_bench.redis_process import INSTALL_HINT, RedisProcess, redis_server_path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Bound every cluster test: a hang fails with its stack instead of stalling the suite."""
    for item in items:
        if "tests/cluster/" in str(item.fspath) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(120))


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    """A running, empty ``redis-server`` (persistence off); stopped after the test.

    Fails (does not skip) when redis-server is missing: these tests are part of CI.
    """
    if redis_server_path() is None:
        pytest.fail(INSTALL_HINT)
    with RedisProcess.running() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    """The URL of :func:`redis_server`."""
    return redis_server.url
