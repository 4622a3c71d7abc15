"""The one port through which every door talks to the scheduling core.

A door authenticates, parses and relays; what it asks of the core is short: the configuration
in force, the tiers and models, to submit and cancel a ticket, whether a caller is refused by
its quotas, the backends (for the Admin door) and a view of the queues. :class:`CorePort`
names exactly that; :class:`~fairq_server.core.FairqCore` implements it, and a door's tests may
hand a door a fake. A door imports this module, never :mod:`fairq_server.core`: what a door
reaches stays the door's own modules, the request's types and the configuration.
It stands beside the core it describes, below the doors that use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fairq_server.backends.request import BackendRequest
from fairq_server.config.schema import BackendConfig, Config
from fairq_server.errors import SchedulerError
from fairq_server.runtime.loop_tools import LoopTools
from fairq_server.scheduling.outbox import Outbox
from fairq_server.scheduling.queue_view import BackendView, QueueView
from fairq_server.telemetry import Telemetry

__all__ = ["CorePort", "Submission", "Submitted"]


@dataclass(frozen=True)
class Submission:
    """A request as a door hands it to the core: what to run, who asks, in which tier.

    Attributes:
        request: what to send to the backend.
        user: fairness identity.
        tier: index into the configured tiers (0 is served first).
        weight: the user's fairness weight (against the other users of its team).
        team: the user's team (None: the user is its own team).
        team_weight: the team's weight against the other teams of the tier.
        group: the user's group (for metrics).
        prompt_tokens: estimated prompt length in tokens.
        max_tokens: requested output bound (0 if unset).
        arrival: monotonic arrival time.
        prefix: chained hashes of the prompt's leading blocks (prefix grouping).

    """

    request: BackendRequest
    user: str
    tier: int
    weight: float
    team: str | None
    team_weight: float
    group: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    prefix: tuple[int, ...]


class Submitted(Protocol):
    """What a door holds of a request it submitted: what it asked for, and its events."""

    @property
    def request(self) -> BackendRequest:
        """Return what was asked for."""

    @property
    def tier(self) -> int:
        """Return the tier it runs in (an index into the tiers)."""

    @property
    def outbox(self) -> Outbox:
        """Return its events on their way to the caller."""


class CorePort(Protocol):
    """What a door asks of the scheduling core."""

    @property
    def config(self) -> Config:
        """Return the configuration in force (bounds, tiers, the doors' own sections)."""

    @property
    def tier_names(self) -> tuple[str, ...]:
        """Return the tier names, highest priority first."""

    @property
    def tools(self) -> LoopTools:
        """Return the event loop's clock, time-slicer and pace (writers take turns on it)."""

    @property
    def telemetry(self) -> Telemetry:
        """Return the process's metrics (requests counted by tier and outcome)."""

    def served_models(self) -> set[str]:
        """Return the models some backend serves now (what ``/v1/models`` lists)."""

    def known_models(self) -> set[str]:
        """Return every model a backend is registered for, up or down (for hints)."""

    def refusal(self, user: str, team: str | None, model: str) -> SchedulerError | None:
        """Return the quota or budget refusal ``user`` meets for ``model`` now, if any."""

    def token_prompt_refusers(self, model: str) -> list[str]:
        """Return the kinds of ``model``'s backends that do not take token-id prompts."""

    def submit(self, submission: Submission) -> Submitted:
        """Queue a request; its outbox then carries what happens to it."""

    def cancel(self, submitted: Submitted) -> None:
        """Take a request out of the queue, or abort its backend request (idempotent)."""

    def backend_views(self) -> list[BackendView]:
        """Return every registered backend, as registered and as it stands now."""

    async def register_remote(self, cfg: BackendConfig) -> BackendView:
        """Register (or replace) a backend asked for over the Admin API.

        Raises:
            SchedulerError: it cannot be used (outside the allowlist, unreachable, ...).

        """

    async def deregister_backend(self, backend_id: str, *, drain: bool) -> bool:
        """Remove a backend (after its running requests end when ``drain``); False: unknown."""

    def queue_view(self) -> QueueView:
        """Return queue depths, queued users and each backend's view and gate, of one moment."""
