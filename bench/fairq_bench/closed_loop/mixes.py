"""The closed-loop mixes: who calls, with how many requests in flight, and what each is owed.

A closed-loop caller keeps ``in_flight`` requests outstanding and sends the next as soon as one
ends, as chat apps (one per person) and agents (two to eight) do. What a caller is owed is its
weighted max-min share of the engine's slots with its concurrency as its demand, between teams
first and then between each team's users (:func:`fair_shares`); its share of the tokens is
that, since every running slot decodes one token per engine step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["JOIN", "MIXES", "QUICK_MIXES", "Caller", "Mix", "fair_shares", "max_min"]


@dataclass(frozen=True)
class Caller:
    """One closed-loop caller.

    Attributes:
        name: its user name (and API key's user).
        in_flight: requests it keeps outstanding.
        tokens: output tokens of each request.
        weight: its fairness weight (inside its team, if it has one).
        team: its team (None: none).
        start: seconds after the run's start when it begins.

    """

    name: str
    in_flight: int
    tokens: int
    weight: float = 1.0
    team: str | None = None
    start: float = 0.0


@dataclass(frozen=True)
class Mix:
    """Callers run together, and the teams' weights."""

    key: str
    title: str
    callers: tuple[Caller, ...]
    teams: Mapping[str, float] = field(default_factory=dict)

    def fair_shares(self, slots: int) -> dict[str, float]:
        """Each caller's owed share of the tokens (see :func:`fair_shares`)."""
        return fair_shares(self.callers, self.teams, slots)


def max_min(
    demands: Mapping[str, float], weights: Mapping[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min (water-filling): ``capacity`` split by weight, no one above its demand."""
    out = dict.fromkeys(demands, 0.0)
    left = dict(demands)
    room = capacity
    while left and room > 1e-12:
        total = sum(weights[k] for k in left)
        level = room / total
        capped = [k for k in left if left[k] <= level * weights[k] + 1e-12]
        if not capped:
            for k in left:
                out[k] += level * weights[k]
            break
        for k in capped:
            out[k] += left[k]
            room -= left[k]
            del left[k]
    return out


def fair_shares(
    callers: tuple[Caller, ...], teams: Mapping[str, float], slots: int
) -> dict[str, float]:
    """Each caller's owed share of the tokens: its max-min slots over all slots used.

    Teams share the slots by their weights (a team's demand is its callers' in-flight summed;
    a caller without a team is its own unit, with its own weight), then each team's callers
    share the team's slots by theirs.
    """
    unit_of = {c.name: ("team:" + c.team if c.team else c.name) for c in callers}
    demand: dict[str, float] = {}
    weight: dict[str, float] = {}
    for c in callers:
        unit = unit_of[c.name]
        demand[unit] = demand.get(unit, 0.0) + c.in_flight
        weight[unit] = teams.get(c.team, 1.0) if c.team else c.weight
    units = max_min(demand, weight, float(slots))
    slots_of: dict[str, float] = {}
    for unit, given in units.items():
        members = [c for c in callers if unit_of[c.name] == unit]
        inner = max_min(
            {c.name: float(c.in_flight) for c in members},
            {c.name: c.weight for c in members},
            given,
        )
        slots_of.update(inner)
    used = sum(slots_of.values()) or 1.0
    return {name: given / used for name, given in slots_of.items()}


def _chat() -> Mix:
    chat = tuple(Caller(f"chat{i}", 1, 100) for i in (1, 2, 3))
    return Mix(
        "chat",
        "3 chat callers (1 in flight, 100 tokens) beside 1 deep caller (8 in flight, 400 tokens)",
        (*chat, Caller("deep", 8, 400)),
    )


def _short_long(k: int) -> Mix:
    return Mix(
        f"short-long-{k}",
        f"short (48 tokens) against long (480 tokens), {k} in flight each",
        (Caller("short", k, 48), Caller("long", k, 480)),
    )


def _teams(k: int) -> Mix:
    red = tuple(Caller(f"red{i}", k, 48, team="red") for i in (1, 2))
    blue = tuple(Caller(f"blue{i}", k, 48, team="blue") for i in (1, 2, 3))
    return Mix(
        f"teams-{k}",
        f"teams red (weight 3, 2 users) and blue (weight 1, 3 users), {k} in flight each",
        (*red, *blue),
        {"red": 3.0, "blue": 1.0},
    )


def _weights() -> Mix:
    return Mix(
        "weights-4",
        "users of weight 2 and 1, 4 in flight each (48 tokens)",
        (Caller("heavy", 4, 48, weight=2.0), Caller("light", 4, 48, weight=1.0)),
    )


MIXES: tuple[Mix, ...] = (
    _chat(),
    *(_short_long(k) for k in (1, 2, 4, 8)),
    *(_teams(k) for k in (2, 4, 12)),
    _weights(),
)
#: The CI guard's mixes: the three the issue measured at their worst.
QUICK_MIXES: tuple[Mix, ...] = (_chat(), _short_long(4), _teams(2))

#: A user that ran alone, and one that joins it 20 s later (``start``): both 12 in flight.
JOIN = Mix(
    "join",
    "A alone with 12 in flight for 20 s, then B joins with 12 (48 tokens each)",
    (Caller("A", 12, 48), Caller("B", 12, 48, start=20.0)),
)
