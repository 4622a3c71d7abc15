"""Keeping a long-running loop alive: log its crash, let the owner clean up, restart it.

A single-writer loop that dies silently turns what it owns into a black hole (a model whose
requests are never dispatched, a backend whose metrics silently go stale), so every such loop
runs under :func:`supervise`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

__all__ = ["RESTART_DELAYS", "OwnedTask", "stop_task", "supervise"]

log = logging.getLogger(__name__)

#: Seconds before each restart: the first is short, repeated crashes back off.
RESTART_DELAYS = (0.05, 0.2, 1.0, 5.0)


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    on_crash: Callable[[BaseException], None] = lambda exc: None,
    on_restart: Callable[[], None] = lambda: None,
    delays: Sequence[float] = RESTART_DELAYS,
) -> None:
    """Run ``run()`` until cancelled, restarting it whenever it raises.

    Args:
        name: what the loop is, for the log.
        run: starts the loop (it should never return; a return ends supervision).
        on_crash: told the exception, before the restart delay (fail what the crash
            affected, report NOT_SERVING).
        on_restart: told when the loop is started again.
        delays: restart delays; the last repeats.

    """
    crashes = 0
    while True:
        try:
            await run()
            return
        except Exception as exc:
            log.exception("%s crashed (%d so far); restarting", name, crashes + 1)
            on_crash(exc)
            await asyncio.sleep(delays[min(crashes, len(delays) - 1)])
            crashes += 1
            on_restart()


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class OwnedTask:
    """The one background task an object runs between its ``start`` and its ``close``.

    Args:
        name: the task's name (shown in asyncio's debug output and task dumps).

    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start ``run()`` as the task, unless it is already running."""
        if self._task is None:
            self._task = asyncio.create_task(run(), name=self._name)

    async def stop(self) -> None:
        """Cancel the task (if started) and wait until it has ended; it may start again."""
        await stop_task(self._task)
        self._task = None
