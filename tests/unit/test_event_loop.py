"""``fairq serve`` runs on uvloop where it is installed, and asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest

from fairq_server.cli import event_loop_factory


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
