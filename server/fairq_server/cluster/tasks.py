"""Stopping a replica's background tasks for certain."""

from __future__ import annotations

import asyncio

__all__ = ["cancel_all"]


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again any that lives on.

    On Python 3.11 a cancellation arriving just as an ``asyncio.timeout`` expires can be
    taken for the timeout and swallowed; the loops here wait under such timeouts.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)
