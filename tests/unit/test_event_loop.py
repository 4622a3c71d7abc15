"""``fairq serve`` runs on uvloop where it is installed, and asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest

from fairq_server.cli import event_loop_factory
from fairq_server.errors import ConfigError


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not built for Windows")
def test_serve_loop_is_uvloop() -> None:
    import uvloop

    factory = event_loop_factory()
    assert factory is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)


def test_without_uvloop_asyncio_default_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # a failed import, as on Windows
    assert event_loop_factory() is None


def test_asyncio_is_chosen_by_name() -> None:
    assert event_loop_factory("asyncio") is None


def test_uvloop_asked_for_and_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        event_loop_factory("uvloop")


def test_an_unknown_loop_is_named() -> None:
    with pytest.raises(ConfigError, match="'trio'"):
        event_loop_factory("trio")
