"""What the dispatcher is told: every change to scheduling state arrives as one of these.

Events flow to the dispatcher from the API layer (submit, cancel), from the pollers (a
scrape sent, a scrape landed), from the stream readers at the backend edge (first token,
tokens, ended, failed) and from the wiring (backends added and removed, a new
configuration). The dispatcher applies them in arrival order; nothing else writes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fairq_server.backends.poller import ScrapeResult
from fairq_server.backends.request import StreamEnd
from fairq_server.config.scheduler import SchedulerConfig
from fairq_server.config.tiers import TierConfig
from fairq_server.scheduling.ticket import Ticket

if TYPE_CHECKING:
    from fairq_server.scheduling.backend_state import BackendState
    from fairq_server.scheduling.counters import Journal, PeerHeads
    from fairq_server.scheduling.policies import Policies

__all__ = [
    "AddBackend",
    "Barrier",
    "Cancel",
    "Event",
    "FairnessSync",
    "FirstToken",
    "JournalEntry",
    "PeerView",
    "Reconfigure",
    "Refused",
    "RemoveBackend",
    "ScrapeLanded",
    "ScrapeSent",
    "StreamEnded",
    "StreamFailed",
    "Submit",
    "TakeJournals",
    "Tokens",
]


@dataclass(frozen=True)
class JournalEntry:
    """One tier's journal: its charges and lifts, the names to read back and the heads.

    ``heads``: the two smallest backlogged users; ``members``: the two smallest backlogged
    members of each group, as ``(group, name, counter)``.
    """

    model: str
    tier: int
    journal: Journal
    active: list[str]
    heads: tuple[tuple[str, float], ...]
    members: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True)
class Submit:
    """Queue ``ticket`` (or refuse it through its outbox)."""

    ticket: Ticket


@dataclass(frozen=True)
class Cancel:
    """The caller is gone: dequeue ``ticket``, or abort its backend request."""

    ticket: Ticket


@dataclass(frozen=True)
class ScrapeSent:
    """A scrape of ``backend_id``'s metrics is leaving now."""

    backend_id: str


@dataclass(frozen=True)
class ScrapeLanded:
    """The outcome of the last scrape sent to ``backend_id``."""

    backend_id: str
    result: ScrapeResult


@dataclass(frozen=True)
class FirstToken:
    """Attempt ``attempt`` of ``ticket`` produced its first text at ``at``."""

    ticket: Ticket
    attempt: int
    at: float


@dataclass(frozen=True)
class Tokens:
    """Attempt ``attempt`` of ``ticket`` produced ``count`` more tokens (batched)."""

    ticket: Ticket
    attempt: int
    count: int


@dataclass(frozen=True)
class StreamEnded:
    """The backend finished attempt ``attempt``; ``tokens`` counts what was relayed."""

    ticket: Ticket
    attempt: int
    end: StreamEnd
    tokens: int


@dataclass(frozen=True)
class StreamFailed:
    """Attempt ``attempt`` failed with ``error`` (a backend error or an unexpected one)."""

    ticket: Ticket
    attempt: int
    error: Exception


@dataclass(frozen=True)
class Refused:
    """The cluster's shared gate refused attempt ``attempt`` before it reached the backend.

    The request goes back among its user's queued requests, its dispatch charge refunded
    (not as a retry, which would pass everyone in its tier): another replica took the slot,
    or Redis could not be asked (the gate decides again, on the local share).
    """

    ticket: Ticket
    attempt: int


@dataclass(frozen=True)
class PeerView:
    """What the other replicas hold on ``backend_id``, and this replica's share (cluster)."""

    backend_id: str
    awaiting: int
    in_flight: int
    share: float


@dataclass(frozen=True)
class TakeJournals:
    """Resolve ``done`` with every fairness journal (cluster: the charges to share)."""

    done: asyncio.Future[list[JournalEntry]]


@dataclass(frozen=True)
class FairnessSync:
    """Shared counters of ``model``'s tier ``tier``, and the other replicas' heads."""

    model: str
    tier: int
    counters: dict[str, float]
    heads: PeerHeads


@dataclass(frozen=True)
class AddBackend:
    """Start routing to ``backend`` (replacing one with the same id)."""

    backend: BackendState


@dataclass(frozen=True)
class RemoveBackend:
    """Stop routing to ``backend_id``; its running requests finish."""

    backend_id: str
    done: asyncio.Future[BackendState | None]


@dataclass(frozen=True)
class Reconfigure:
    """Switch to new settings and plugins; with ``rebuild``, queues are rebuilt with them.

    ``done`` is resolved once they apply (the caller learns when the switch happened).
    """

    tiers: tuple[TierConfig, ...]
    config: SchedulerConfig
    policies: Policies
    rebuild: bool
    done: asyncio.Future[None] | None = None


@dataclass(frozen=True)
class Barrier:
    """Resolve ``done`` once every event posted before this one is applied."""

    done: asyncio.Future[None]


Event = (
    Submit
    | Cancel
    | ScrapeSent
    | ScrapeLanded
    | FirstToken
    | Tokens
    | StreamEnded
    | StreamFailed
    | Refused
    | PeerView
    | TakeJournals
    | FairnessSync
    | AddBackend
    | RemoveBackend
    | Reconfigure
    | Barrier
)
