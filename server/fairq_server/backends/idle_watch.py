"""A generation stream's read timeout, at the cost of a clock read per network read.

A backend stream that stops sending for ``backend_timeout_seconds`` fails (the backend hung,
or the connection was lost without a reset). aiohttp's own per-read timeout (``sock_read``)
does that by cancelling and re-arming a timer at every read, and with every token of every
stream passing through that was 5-6 % of fairq's CPU under load (docs/design/hot-path.md).
:class:`IdleWatch` keeps one timer per stream instead, due at most once per timeout: each read
only notes the time, and the timer, when it fires, either finds a read since (and re-arms for
the rest of the timeout) or fails the body with the error aiohttp would have raised.

Generation streams are therefore posted with :data:`STREAM_TIMEOUT` (no per-read timeout);
the wait for the answer's headers is bounded around the post (``http_reading.posted``).
"""

from __future__ import annotations

import asyncio

import aiohttp

__all__ = ["CONNECT_SECONDS", "STREAM_TIMEOUT", "IdleWatch"]

#: Connecting to a backend must be quick, whatever it is asked.
CONNECT_SECONDS = 5.0
#: The client timeouts of a generation stream: the idle bound is the stream's :class:`IdleWatch`.
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SECONDS, sock_read=None)


class IdleWatch:
    """Fails ``body`` with :class:`aiohttp.ServerTimeoutError` after ``seconds`` without a read.

    Call :meth:`read` at every network read and :meth:`close` when the stream is done.
    """

    def __init__(self, body: aiohttp.StreamReader, seconds: float) -> None:
        self._body = body
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(
            self.last + seconds, self._check
        )

    def read(self) -> None:
        """Note a network read (data arrived): the idle time starts again."""
        self.last = self._loop.time()

    def close(self) -> None:
        """Stop watching."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        due = self.last + self._seconds
        if self._loop.time() < due:  # read since: wait out the rest from the last read
            self._timer = self._loop.call_at(due, self._check)
            return
        self._timer = None
        self._body.set_exception(
            aiohttp.ServerTimeoutError(f"no data from the backend for {self._seconds:g} s")
        )
