"""One poll of the store's version counters for every table a replica follows.

The key store and the stored entitlement each keep what they read in memory and reload it
when their counter in ``store_versions`` moved (every change raises it in its own
transaction). Asking the database is the replica's main cost when idle (a connection checked
out, a query through SQLAlchemy and the driver's thread), so one query every
``key_poll_seconds`` reads every counter and each follower whose counter moved reloads:
a change made on any replica still holds on every replica within one poll and one reload.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.runtime.supervisor import stop_task
from fairq_server.store.engine import poll_forever
from fairq_server.store.schema import store_versions

__all__ = ["Follower", "VersionWatch"]

_VERSIONS = select(store_versions.c.name, store_versions.c.version)


class Follower(Protocol):
    """What follows one counter of ``store_versions``."""

    @property
    def version(self) -> int | None:
        """The counter's value at the last reload (None before the first)."""
        ...

    async def refresh(self) -> bool:
        """Reload if the counter moved; True when it did."""
        ...

    def unreadable(self, error: str) -> None:
        """Report that the store could not be read (``error`` is short)."""
        ...


class VersionWatch:
    """Reads every counter once per ``seconds``; reloads the followers whose counter moved.

    Args:
        engine: the store's engine (its schema current).
        seconds: how often to ask.
        followers: each follower by the name of its counter.

    """

    def __init__(
        self, engine: AsyncEngine, seconds: float, followers: Mapping[str, Follower]
    ) -> None:
        self._engine = engine
        self._seconds = seconds
        self._followers = dict(followers)
        self._task: asyncio.Task[None] | None = None
        # When the first poll since the database's last answer was asked (None: it answered
        # the last one; the followers have just read the store).
        self._asked: float | None = None

    @property
    def silent_seconds(self) -> float:
        """Seconds the database has left the polls unanswered (0 while it answers).

        Counted from the first poll asked since its last answer, not from that answer: a
        replica whose loop was late to ask (a loaded machine, a slow start) has a store that
        answers, and was once refused as "not answered for 2 s" with the database up.
        """
        return 0.0 if self._asked is None else time.monotonic() - self._asked

    def start(self) -> None:
        """Start polling (the followers have read the store once already)."""
        self._task = asyncio.create_task(
            poll_forever(self.poll, self._seconds, self._unreadable), name="store-versions"
        )

    async def close(self) -> None:
        """Stop polling."""
        await stop_task(self._task)
        self._task = None

    async def poll(self) -> None:
        """Read the counters; reload every follower whose counter moved.

        A follower that fails to reload does not keep the others from theirs.

        Raises:
            Exception: the counters could not be read, or a follower's reload failed (the
                first such error, after every follower had its turn).

        """
        if self._asked is None:
            self._asked = time.monotonic()
        async with self._engine.connect() as conn:
            rows = (await conn.execute(_VERSIONS)).all()
        self._asked = None
        versions = {str(name): int(version) for name, version in rows}
        failure: Exception | None = None
        for name, follower in self._followers.items():
            if versions.get(name) == follower.version:
                continue
            try:
                await follower.refresh()
            except Exception as exc:  # raised below, once the others had their turn
                failure = failure or exc
        if failure is not None:
            raise failure

    def _unreadable(self, error: str) -> None:
        for follower in self._followers.values():
            follower.unreadable(error)
