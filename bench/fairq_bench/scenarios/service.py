"""Service accounting from client-side traces: who got how much, when, and how fair it was.

Service is counted in VTC's cost units (Sheng et al., OSDI 2024): prompt tokens plus twice the
output tokens, the same cost function fairq's ``vtc`` policy charges. A request's prompt counts
when its first text arrives (prefill is done by then); its output tokens count as they arrive.
The client sees characters, not tokens, and fairq merges fast streams into one chunk per
20 ms, so each chunk's characters are converted with the request's own characters-per-token
ratio (exact for finished requests, which ask for an exact length with ``ignore_eos``) or the
run's average one (for requests cut off at the end of the run).

Fairness over a window is Jain's index of *normalized* service: each user's service divided
by its max-min fair share of what was served in that window (water-filling over the users'
demand: what they had waiting at the start of the window plus what they sent during it). A
user who asks for less than an equal share and gets all of it counts as treated fairly, so
1.0 means "max-min fair" even when users send at very different rates.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence

from fairq_bench.scenarios.tracing import Trace
from fairq_bench.scenarios.workloads import prompt_tokens

__all__ = [
    "OUTPUT_WEIGHT",
    "Ledger",
    "chars_per_token",
    "jain",
    "water_fill",
]

OUTPUT_WEIGHT = 2.0


def chars_per_token(traces: Iterable[Trace]) -> float:
    """Average characters per output token over the finished requests (4.0 if none)."""
    chars = tokens = 0
    for t in traces:
        if t.finished and t.chars:
            chars += t.chars
            tokens += t.spec.max_tokens
    return chars / tokens if tokens else 4.0


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one value takes everything."""
    values = [v for v in values if v >= 0]
    if not values:
        return float("nan")
    square_sum = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * square_sum) if square_sum else 1.0


def water_fill(demands: dict[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair shares of ``capacity`` for users asking for ``demands``."""
    shares = dict.fromkeys(demands, 0.0)
    left = capacity
    pending = sorted((d, u) for u, d in demands.items() if d > 0)
    while pending and left > 1e-9:
        level = left / len(pending)
        demand, user = pending[0]
        if demand <= level:
            shares[user] = demand
            left -= demand
            pending.pop(0)
        else:
            for _, u in pending:
                shares[u] = level
            left = 0.0
            pending = []
    return shares


class Ledger:
    """Service events and demand events per user, from one run's traces.

    Args:
        traces: the run's traces.
        ratio: characters per token for unfinished requests (default: from the traces).
        weights: per-user weights; service and demand are divided by them, so equal
            normalized service means service in proportion to the weights.

    """

    def __init__(
        self,
        traces: Sequence[Trace],
        ratio: float | None = None,
        weights: dict[str, float] | None = None,
    ) -> None:
        ratio = ratio or chars_per_token(traces)
        weights = weights or {}
        self.users = sorted({t.spec.user for t in traces})
        served: dict[str, list[tuple[float, float]]] = defaultdict(list)
        asked: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for t in traces:
            user = t.spec.user
            w = weights.get(user, 1.0)
            prompt = prompt_tokens(t.spec)
            asked[user].append((t.spec.at, (prompt + OUTPUT_WEIGHT * t.spec.max_tokens) / w))
            if t.first is None:
                continue
            served[user].append((t.first, prompt / w))
            per_char = t.spec.max_tokens / t.chars if t.finished and t.chars else 1 / ratio
            last_tokens = 0.0
            for at, chars in t.points:
                tokens = min(chars * per_char, float(t.spec.max_tokens))
                served[user].append((at, OUTPUT_WEIGHT * (tokens - last_tokens) / w))
                last_tokens = tokens
        self._served = {u: _cumulative(served[u]) for u in self.users}
        self._asked = {u: _cumulative(asked[u]) for u in self.users}

    def served(self, user: str, at: float) -> float:
        """Service ``user`` had received by time ``at``."""
        return _value_at(self._served[user], at)

    def asked(self, user: str, at: float) -> float:
        """Cost of the requests ``user`` had sent by time ``at``."""
        return _value_at(self._asked[user], at)

    def served_between(self, t0: float, t1: float) -> dict[str, float]:
        """Service per user in ``[t0, t1)``."""
        return {u: self.served(u, t1) - self.served(u, t0) for u in self.users}

    def shares(self, t0: float, t1: float) -> dict[str, float]:
        """Each user's fraction of the service given in ``[t0, t1)``."""
        got = self.served_between(t0, t1)
        total = sum(got.values())
        return {u: v / total if total else float("nan") for u, v in got.items()}

    def window_jain(self, t0: float, t1: float) -> float:
        """Jain's index of service normalized by max-min fair shares over ``[t0, t1)``."""
        got = self.served_between(t0, t1)
        demand = {u: max(self.asked(u, t1) - self.served(u, t0), 0.0) for u in self.users}
        fair = water_fill(demand, sum(got.values()))
        return jain([got[u] / fair[u] for u in self.users if fair[u] > 1e-9])

    def windows(self, t0: float, t1: float, width: float) -> list[tuple[float, float]]:
        """``(window start, Jain's index)`` for consecutive windows of ``width`` in [t0, t1]."""
        out = []
        start = t0
        while start + width <= t1 + 1e-9:
            out.append((start, self.window_jain(start, start + width)))
            start += width
        return out


def _cumulative(events: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    events.sort()
    times, totals = [], []
    total = 0.0
    for at, amount in events:
        total += amount
        times.append(at)
        totals.append(total)
    return times, totals


def _value_at(curve: tuple[list[float], list[float]], at: float) -> float:
    times, totals = curve
    i = bisect.bisect_right(times, at)
    return totals[i - 1] if i else 0.0
