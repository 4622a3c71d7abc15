"""An attempt's backend stream: read into a sink that reports to the dispatcher.

The default launcher (:class:`StreamLauncher`) reads the backend's stream with
:func:`~fairq_server.backends.stream_reader.start_reading` into an :class:`AttemptSink`. The
sink puts text straight into the request's outbox and posts first token, token counts, end and
failure to the dispatcher (applied by :class:`~fairq_server.scheduling.attempts.AttemptBook`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable

from fairq_server.backends.request import StreamEnd, StreamEvent, TextDelta
from fairq_server.backends.stream_reader import start_reading
from fairq_server.errors import SlowClientError
from fairq_server.runtime.loop_tools import LoopTools
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.lookahead import LOOKAHEAD_TOKENS
from fairq_server.scheduling.ticket import AttemptHandle, Ticket

__all__ = ["CHARGE_EVERY", "AttemptSink", "Launcher", "StreamLauncher", "attempt_stream"]

#: Starts ``ticket``'s current attempt on ``ticket.backend`` with ``ticket.priority``.
Launcher = Callable[[Ticket], AttemptHandle]

# Token charges are batched so a fast stream does not post one event per token.
CHARGE_EVERY = 16


def attempt_stream(ticket: Ticket) -> AsyncGenerator[StreamEvent]:
    """Return the stream of ``ticket``'s attempt: its backend's, or its carrier's."""
    assert ticket.backend is not None
    if ticket.carrier is not None:
        return ticket.carrier.stream(ticket)
    return ticket.backend.backend.stream(ticket.request, ticket.priority)


class AttemptSink:
    """Reports one attempt's stream: text to the outbox, lifecycle to the dispatcher."""

    def __init__(self, post: Callable[[ev.Event], None], ticket: Ticket) -> None:
        self._post = post
        self._ticket = ticket
        self._attempt = ticket.attempt
        self._tokens = 0
        self._uncharged = 0
        self._progress = ticket.progress
        self._near = not ticket.max_tokens  # the end is not known ahead: never "near"

    def _nearly_done(self) -> bool:
        """Whether the request is within the lookahead of its end (told once, at once)."""
        ticket = self._ticket
        if ticket.max_tokens - ticket.charged_completion - self._uncharged > LOOKAHEAD_TOKENS:
            return False
        self._near = True
        return True

    def text(self, delta: TextDelta) -> bool:
        """See :meth:`~fairq_server.backends.stream_reader.StreamSink.text`."""
        ticket, attempt = self._ticket, self._attempt
        if not self._tokens:
            self._post(ev.FirstToken(ticket, attempt, time.monotonic()))
        self._tokens += delta.tokens
        self._uncharged += delta.tokens
        if self._uncharged >= CHARGE_EVERY or (not self._near and self._nearly_done()):
            self._post(ev.Tokens(ticket, attempt, self._uncharged))
            self._uncharged = 0
        if self._progress is not None:
            self._progress.record(delta)
        if ticket.outbox.put_text(delta.text, delta.extra):
            return True
        error = SlowClientError(
            f"the client left more than {ticket.outbox.limit} characters of text unread; "
            "the stream was cut off"
        )
        self._post(ev.StreamFailed(ticket, attempt, error))
        return False

    def left(self) -> int | None:
        """See :meth:`~fairq_server.backends.stream_reader.StreamSink.left`.

        Only on a backend whose slots fairq counts (``max_in_flight``): there a stream's end
        seen late is a slot left empty. Elsewhere the engine's own queue fills the slot, and
        reading the last window sooner would only cost reads (None: paced as before).
        """
        backend = self._ticket.backend
        if backend is None or not backend.max_in_flight:
            return None
        # A continuation's bound is the request's less what earlier attempts generated.
        done = self._progress.tokens if self._progress is not None else self._tokens
        return self._ticket.tokens_left(done)

    def ended(self, end: StreamEnd) -> None:
        """See :meth:`~fairq_server.backends.stream_reader.StreamSink.ended`."""
        self._post(ev.StreamEnded(self._ticket, self._attempt, end, self._tokens))

    def failed(self, error: Exception) -> None:
        """See :meth:`~fairq_server.backends.stream_reader.StreamSink.failed`."""
        self._post(ev.StreamFailed(self._ticket, self._attempt, error))


class StreamLauncher:
    """Reads each attempt's backend stream into an :class:`AttemptSink`.

    Args:
        post: where the sinks post events (the dispatcher's inbox).
        window: read pacing of fast streams (see :mod:`~fairq_server.backends.stream_reader`).
        tools: the loop's share, pace and clock the readers use (a fresh set if None).

    """

    def __init__(
        self, post: Callable[[ev.Event], None], window: float, tools: LoopTools | None = None
    ) -> None:
        self._post = post
        self.window = window
        self.tools = tools if tools is not None else LoopTools()
        #: Whether the slot of an attempt ending now may be held for its user's next request
        #: (the dispatcher's anticipation; set once the dispatcher exists).
        self.may_hold: Callable[[Ticket], bool] = lambda ticket: False

    def __call__(self, ticket: Ticket) -> AttemptHandle:
        """Start reading ``ticket``'s current attempt."""
        return start_reading(
            attempt_stream(ticket), AttemptSink(self._post, ticket), self.window, self.tools
        )

    def let_go(self, ended: Ticket) -> None:
        """Free the slot kept for the user of ``ended`` after its end (no hold, or it lapsed).

        Nothing to do for one process. A cluster's launcher keeps an ended attempt's slot
        claimed in the shared gate while :attr:`may_hold` says it may be held.
        """

    def hand_over(self, victim: Ticket, to: Ticket) -> None:
        """Give the slot ``victim`` holds to ``to``'s next attempt (preemption, anticipation).

        ``victim`` is about to be aborted, or has ended with its slot held for ``to``'s user.
        Nothing to do for one process: its slot count is its own. A cluster's launcher keeps
        the slot claimed in the shared gate for ``to``.
        """
