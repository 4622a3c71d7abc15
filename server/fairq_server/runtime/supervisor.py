"""Long-running loops: kept alive (crash logged, owner told, restarted) and stopped for sure.

A single-writer loop that dies silently turns what it owns into a black hole (a model whose
requests are never dispatched, a backend whose metrics silently go stale), so every such loop
runs under :func:`supervise`.

A loop that does not stop is as bad at shutdown: on Python 3.11, ``asyncio.wait_for`` returns
the result instead of raising when a cancellation arrives as the awaited work completes (fixed
in 3.12), and redis-py wraps every command it sends under a socket timeout in it. Measured with
a Redis pub/sub reader like the cluster's: 14 % of cancellations were swallowed so, and a loop
that went on lived through every later one for a minute once. So a stop cancels until the task
has ended (:func:`cancel_all`), and every background loop tests :func:`stop_asked` at its head:
a swallowed cancellation leaves the task's cancel request counted, so the loop ends at its next
turn whatever library code swallowed it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from fairq_server.runtime.clock import SYSTEM_CLOCK, Clock

__all__ = ["RESTART_DELAYS", "OwnedTask", "cancel_all", "stop_asked", "stop_task", "supervise"]

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
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Run ``run()`` until cancelled, restarting it whenever it raises.

    Args:
        name: what the loop is, for the log.
        run: starts the loop (it should never return; a return ends supervision).
        on_crash: told the exception, before the restart delay (fail what the crash
            affected, report NOT_SERVING).
        on_restart: told when the loop is started again.
        delays: restart delays; the last repeats.
        clock: what the delays are waited on.

    """
    crashes = 0
    while True:
        try:
            await run()
            return
        except Exception as exc:
            log.exception("%s crashed (%d so far); restarting", name, crashes + 1)
            on_crash(exc)
            await clock.sleep(delays[min(crashes, len(delays) - 1)])
            crashes += 1
            on_restart()


def stop_asked() -> bool:
    """Whether the running task has been asked to stop (cancelled, and not by a timeout).

    ``asyncio.timeout`` takes back the cancellations it makes; one from outside stays counted
    (``Task.cancelling``) even when library code swallowed the ``CancelledError``.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again any that lives on.

    Waiting does not raise the tasks' ``CancelledError`` here, so a cancellation of the caller
    itself is not mistaken for theirs and swallowed.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is not None:
        await cancel_all([task])


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
