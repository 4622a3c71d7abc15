"""The ``[[teams]]`` section: each team's name and weight, and the checks keys are held to.

Configuration::

    [[teams]]
    name = "research"
    weight = 2

A team named by a key or a token but not configured has weight 1; when ``[[teams]]`` is given,
a key naming a team not in it is refused at start and at reload, and a stored key at its
creation (a typo would otherwise put the key's user in a team of its own at weight 1, outside
the team's quotas and budgets, silently). How weights are used: :mod:`fairq_server.tenancy.teams`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Float, Str, doc, section

__all__ = [
    "DEFAULT_TEAM_WEIGHT",
    "TeamConfig",
    "TeamError",
    "check_team_known",
    "check_teams",
]

#: The weight of a team that is not configured (and of a user without a team).
DEFAULT_TEAM_WEIGHT = 1.0


class TeamError(ValueError):
    """The ``[[teams]]`` table, or a key's team, is not usable."""


@section
@dataclass(frozen=True)
class TeamConfig:
    """A team and its share of each tier."""

    name: Annotated[Str, doc("the team's name, as keys and tokens give it (verbatim)")]
    weight: Annotated[
        Float, doc("service owed against the other teams; 2 is twice a team of weight 1", gt=0)
    ] = DEFAULT_TEAM_WEIGHT


def check_teams(teams: Iterable[TeamConfig], key_teams: Iterable[tuple[str, str]]) -> None:
    """Refuse unusable teams, and keys naming a team that is not configured.

    Args:
        teams: the ``[[teams]]`` entries.
        key_teams: ``(what, team)`` for every key with a team; ``what`` names the key in the
            error (``keys[3].team``). Only checked when some team is configured.

    Raises:
        TeamError: naming the entry or key at fault.

    """
    seen: set[str] = set()
    for i, team in enumerate(teams):
        if not isinstance(team.weight, int | float) or isinstance(team.weight, bool):
            raise TeamError(f"teams[{i}].weight must be a number, not {team.weight!r}")
        if not (math.isfinite(team.weight) and team.weight > 0):
            raise TeamError(
                f"teams[{i}].weight must be a finite number above 0, not {team.weight!r}"
            )
        if team.name in seen:
            raise TeamError(f"teams[{i}]: team {team.name!r} is configured twice")
        seen.add(team.name)
    for what, name in key_teams:
        check_team_known(what, name, seen)


def check_team_known(what: str, name: str, known: Collection[str]) -> None:
    """Refuse a key's team ``name`` when teams are configured and it is not one of ``known``.

    A file key, a stored key (at its creation) and a quota are held to the same rule.

    Args:
        what: names the key in the error (``keys[3].team``, ``team``).
        name: the team the key names.
        known: the teams in force (the file's, and in a store the ones set live); empty:
            no team is configured, and any name is a team of weight 1.

    Raises:
        TeamError: naming ``what`` and the configured teams.

    """
    if not known or name in known:
        return
    shown = sorted(map(repr, known))
    listed = ", ".join(shown[:20]) + (f" and {len(shown) - 20} more" if len(shown) > 20 else "")
    raise TeamError(
        f"{what}: team {name[:64]!r} is not configured in [[teams]] (configured: {listed})"
    )
