"""The ``[console]`` section: the operator's web console on the HTTP door's port."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConsoleConfig"]


@dataclass(frozen=True)
class ConsoleConfig:
    """The web console under ``/console`` on the HTTP door (admins only).

    Attributes:
        enabled: serve the console (needs ``http.listen``); off by default.
        refresh_seconds: how often the live views are read and pushed to open pages, and how
            often a replica publishes its view to Redis in a cluster.
        session_seconds: a login lasts this long (the key is checked again on every request,
            so a revoked key ends its sessions at once).
        starved_after_seconds: a backlogged user whose next request has waited this long
            while it received less than half its entitlement of recent service is marked
            starved.
        max_users: at most this many users are listed per model and tier (the busiest first;
            the counts always cover everyone).
        history_seconds: how often the trends (queue depth, waits, time to first token,
            tokens per second) are sampled, whether a page is open or not; 0: no trends.
        history_points: samples kept per figure (360 every 5 s: the last 30 minutes).

    """

    enabled: bool = False
    refresh_seconds: float = 1.0
    session_seconds: float = 8 * 3600.0
    starved_after_seconds: float = 10.0
    max_users: int = 50
    history_seconds: float = 5.0
    history_points: int = 360
