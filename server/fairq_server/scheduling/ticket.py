"""A queued request: what the scheduler knows about it, and how it reports back."""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fairq_server.backends.base import BackendRequest
    from fairq_server.backends.registry import BackendEntry

__all__ = ["Ticket", "TicketState"]

_seq = itertools.count()


class TicketState(enum.Enum):
    """Where a ticket is in its life. Only the dispatcher changes it."""

    NEW = "new"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False)
class Ticket:
    """One request on its way through fairq.

    The servicer creates it and waits on its futures; the dispatcher, the only writer of queue
    state, resolves ``enqueued`` (queue position, or a rejection) and then ``assigned`` (the
    backend to use, or an eviction). Every ticket is finalized exactly once.

    Attributes:
        request: what to send to the backend.
        user: fairness identity.
        tier: index into the configured tiers (0 is served first).
        weight: the user's fairness weight.
        prompt_tokens: estimated prompt length in tokens.
        max_tokens: requested output bound (0 if unset).
        seq: global arrival order, the final tie-break everywhere.
        prefix: chained hashes of the prompt's leading blocks (prefix grouping).
        arrival: monotonic arrival time.

    """

    request: BackendRequest
    user: str
    tier: int
    weight: float = 1.0
    prompt_tokens: int = 0
    max_tokens: int = 0
    group: str = "default"
    seq: int = field(default_factory=lambda: next(_seq))
    arrival: float = field(default_factory=time.monotonic)
    state: TicketState = TicketState.NEW
    generating: bool = False  # the backend has produced a token for the current attempt
    retries: int = 0
    excluded: frozenset[str] = frozenset()
    prefix: tuple[int, ...] = ()
    priority_tier: int | None = None  # whose backend priority to send (set at dispatch)
    entry: BackendEntry | None = None
    enqueued: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    assigned: asyncio.Future[BackendEntry] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def cost(self) -> int:
        """Estimated service cost in tokens (prompt plus the output bound)."""
        return self.prompt_tokens + self.max_tokens
