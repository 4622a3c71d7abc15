"""A replica's background tasks: run a step forever, run one in the background."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fairq_server.runtime.supervisor import stop_asked

__all__ = ["forever", "spawn"]

log = logging.getLogger(__name__)


async def forever(step: Callable[[], Coroutine[Any, Any, None]], every: float) -> None:
    """Run ``step`` every ``every`` seconds until cancelled."""
    while not stop_asked():
        await asyncio.sleep(every)
        try:
            await step()
        except Exception:  # a bug here must not stop the heartbeat for good
            log.exception("cluster task step failed")


def spawn(
    tasks: set[asyncio.Task[Any]],
    coro: Coroutine[Any, Any, None],
    errors: tuple[type[Exception], ...],
    on_error: Callable[[Exception], None],
) -> None:
    """Run ``coro`` in a task kept in ``tasks`` until done; ``errors`` go to ``on_error``."""

    async def run() -> None:
        try:
            await coro
        except errors as exc:
            on_error(exc)

    task = asyncio.create_task(run())
    tasks.add(task)
    task.add_done_callback(tasks.discard)
