"""The one port through which every door talks to the scheduling core.

A door authenticates, parses and relays; what it asks of the core is short: the configuration
in force, the tiers and models, to submit and cancel a ticket, whether a caller is refused by
its quotas, the backends (for the Admin door) and a view of the queues. :class:`CorePort`
names exactly that; :class:`~fairq_server.core.FairqCore` implements it, and a door's tests may
hand a door a fake. A door imports this module, never :mod:`fairq_server.core`: what a door
reaches stays the door's own modules, the request's types and the configuration.
"""

from __future__ import annotations

from typing import Protocol

from fairq_server.config.schema import BackendConfig, Config
from fairq_server.errors import SchedulerError
from fairq_server.scheduling.queue_view import BackendView, QueueView
from fairq_server.scheduling.ticket import Ticket
from fairq_server.telemetry import Telemetry

__all__ = ["CorePort"]


class CorePort(Protocol):
    """What a door asks of the scheduling core."""

    @property
    def config(self) -> Config:
        """Return the configuration in force (bounds, tiers, the doors' own sections)."""

    @property
    def tier_names(self) -> tuple[str, ...]:
        """Return the tier names, highest priority first."""

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

    def submit(self, ticket: Ticket) -> None:
        """Queue ``ticket``; its outbox then carries what happens to it."""

    def cancel(self, ticket: Ticket) -> None:
        """Take ``ticket`` out of the queue, or abort its backend request (idempotent)."""

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
