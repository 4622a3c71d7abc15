"""A request on its way through fairq: what the scheduler knows about it, and its outbox."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from fairq_server.scheduling.outbox import Outbox

if TYPE_CHECKING:
    from fairq_server.backends.continuation import Progress
    from fairq_server.backends.request import BackendRequest, StreamEvent
    from fairq_server.scheduling.backend_state import BackendState
    from fairq_server.tenancy.books.book import Claim

__all__ = ["AttemptHandle", "Carrier", "Ticket", "TicketState"]

_seq = itertools.count()


class TicketState(enum.Enum):
    """Where a ticket is in its life. Only the dispatcher changes it."""

    NEW = "new"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class AttemptHandle(Protocol):
    """A backend request in progress; cancelling it aborts the request at the backend."""

    def cancel(self) -> object:
        """Abort the backend request (its stream reports nothing more)."""
        ...


class Carrier(Protocol):
    """Carries a request's bytes outside fairq (a proxy in front: the ext_proc door).

    The dispatcher still picks the backend and holds the slot; the launcher, instead of
    opening the backend stream, reads :meth:`stream`, which tells the carrier where to send
    the request and reports its end (with the backend's usage) when the carrier says so.
    """

    def stream(self, ticket: Ticket) -> AsyncGenerator[StreamEvent]:
        """Send ``ticket`` to ``ticket.backend`` elsewhere; yield its end when it comes."""
        ...


@dataclass(eq=False)
class Ticket:
    """One request on its way through fairq.

    The API layer creates it, submits it to the dispatcher and reads ``outbox`` until a
    final event; it cancels the ticket when it stops reading for any reason. Everything else
    on a ticket is written by the dispatcher alone, and every ticket is finalized exactly
    once.

    Attributes:
        request: what to send to the backend.
        user: fairness identity.
        tier: index into the configured tiers (0 is served first).
        weight: the user's fairness weight (against the other users of its team).
        team: the user's team (None: the user is its own team).
        team_weight: the team's weight against the other teams of the tier.
        prompt_tokens: estimated prompt length in tokens.
        max_tokens: requested output bound (0 if unset).
        seq: global arrival order, the final tie-break everywhere.
        prefix: chained hashes of the prompt's leading blocks (prefix grouping).
        arrival: monotonic arrival time.
        outbox: events towards the caller.
        carrier: None: fairq opens the backend stream; else the carrier does (its
            :meth:`Carrier.stream` stands for the backend's).

    """

    request: BackendRequest
    user: str
    tier: int
    weight: float = 1.0
    team: str | None = None
    team_weight: float = 1.0
    prompt_tokens: int = 0
    max_tokens: int = 0
    group: str = "default"
    seq: int = field(default_factory=lambda: next(_seq))
    arrival: float = field(default_factory=time.monotonic)
    prefix: tuple[int, ...] = ()
    outbox: Outbox = field(default_factory=Outbox)
    carrier: Carrier | None = None
    # -- the dispatcher's ------------------------------------------------------------------
    state: TicketState = TicketState.NEW
    retries: int = 0
    excluded: frozenset[str] = frozenset()
    priority_tier: int | None = None  # whose backend priority to send (set at dispatch)
    priority: int = 0  # the priority sent to the backend with the current attempt
    boosted: bool = False  # the current attempt went with a fair-share boost
    backend: BackendState | None = None  # of the current attempt
    attempt: int = 0  # numbers attempts, so a late event of an aborted one is ignored
    handle: AttemptHandle | None = None
    generating: bool = False  # the backend has produced a token for the current attempt
    dispatched_at: float = 0.0
    first_token_at: float | None = None
    charged_prompt: float = 0.0
    charged_completion: int = 0
    refused: bool = False  # counted once in the gate refusals
    finishing: bool = False  # counted in its backend's ``finishing`` (lookahead)
    progress: Progress | None = None  # the output so far, kept where it may be preempted
    claim: Claim | None = None  # the current attempt's reservation against quotas and budgets
    # The request this one preempted: its slot goes back to it when this one ends.
    lender: Ticket | None = None
    # Set while the ticket counts as running in its tier's fairness (see TierQueue.started);
    # calling it ends that, once.
    stop_running: Callable[[], None] | None = None

    def stopped_running(self) -> None:
        """Tell the tier's fairness this request no longer runs (harmless if it did not)."""
        stop, self.stop_running = self.stop_running, None
        if stop is not None:
            stop()

    def tokens_left(self, generated: int) -> int | None:
        """Return the tokens the request may still produce after ``generated``.

        By the ``max_tokens`` its caller sent (None: the caller set no bound).
        """
        bound = self.request.sampling.max_tokens
        return None if bound is None else bound - generated

    @property
    def cost(self) -> int:
        """Estimated service cost in tokens (prompt plus the output bound)."""
        return self.prompt_tokens + self.max_tokens
