"""Team names as metric labels: verbatim, but a bounded number of them.

Team names come from keys and from tokens (an IdP's claim), so their number is not fixed
by the configuration; each distinct label value is a time series in every scraper. The first
:data:`MAX_TEAM_LABELS` teams seen by this process get their own label, the rest share
``other``; a user without a team counts under ``none``.
"""

from __future__ import annotations

__all__ = ["MAX_TEAM_LABELS", "NO_TEAM", "OTHER_TEAMS", "TeamLabels"]

#: Distinct team labels one process exports.
MAX_TEAM_LABELS = 100
#: The label of users without a team.
NO_TEAM = "none"
#: The label of teams past the cap.
OTHER_TEAMS = "other"


class TeamLabels:
    """Maps a team to its metric label, keeping at most ``cap`` distinct team labels.

    Args:
        cap: how many teams get a label of their own (the rest: ``other``).

    """

    def __init__(self, cap: int = MAX_TEAM_LABELS) -> None:
        self._cap = cap
        self._known: set[str] = set()

    def label(self, team: str | None) -> str:
        """Return ``team``'s label: its name, ``none`` (no team) or ``other`` (past the cap).

        A team named like one of the reserved labels is still told apart: its label is
        prefixed with ``team:``.
        """
        if team is None:
            return NO_TEAM
        if team in (NO_TEAM, OTHER_TEAMS):
            team = "team:" + team
        if team in self._known:
            return team
        if len(self._known) < self._cap:
            self._known.add(team)
            return team
        return OTHER_TEAMS
