"""Teams: how a caller's team is resolved to the weight it is owed.

A user belongs to at most one team (from its key's ``team`` or its token's team claim); a
team's weight says how much of a tier's service it is owed against the other teams (see
``docs/design/tenancy.md``). A user without a team is its own team of weight 1, which is how
fairq shared service before teams existed. The ``[[teams]]`` section itself, and the checks
keys are held to: :mod:`fairq_server.config.teams`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from fairq_server.config.teams import DEFAULT_TEAM_WEIGHT, TeamConfig

__all__ = ["TeamWeights", "team_weights"]


class TeamWeights:
    """The configured teams' weights: resolves a caller's team to the weight it is owed.

    Args:
        teams: the configured teams (names are unique; checked by :func:`check_teams`).

    """

    def __init__(self, teams: Iterable[TeamConfig] = ()) -> None:
        self._weights: Mapping[str, float] = {t.name: t.weight for t in teams}

    @property
    def configured(self) -> bool:
        """Whether any team is configured (then a key's team must be one of them)."""
        return bool(self._weights)

    def __contains__(self, team: object) -> bool:
        return team in self._weights

    def weight(self, team: str | None) -> float:
        """Return ``team``'s weight: configured, else 1 (also for no team)."""
        if team is None:
            return DEFAULT_TEAM_WEIGHT
        return self._weights.get(team, DEFAULT_TEAM_WEIGHT)

    def resolve(self, team: str | None) -> tuple[str | None, float]:
        """Return ``(team, weight)`` for a principal's team (None: the user is its own team)."""
        return team, self.weight(team)

    def names(self) -> list[str]:
        """Return the configured team names, in configuration order."""
        return list(self._weights)


@functools.lru_cache(maxsize=4)
def team_weights(teams: tuple[TeamConfig, ...]) -> TeamWeights:
    """Return the :class:`TeamWeights` of ``teams`` (cached: asked on every request)."""
    return TeamWeights(teams)
