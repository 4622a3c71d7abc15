"""The console's recent past: a few figures sampled every few seconds into a bounded ring.

The live views say what holds now; an operator also asks what changed: did the queue grow,
did waits or time to first token rise, who is being served. :class:`LiveHistory` samples, every
``ConsoleConfig.history_seconds`` (whether a page is open or not, so a page shows the recent
past as soon as it opens), per model the requests queued and running, per tier the mean queue
wait and time to first token of the requests that got there since the last sample (from the
``fairq_queue_wait_seconds`` and ``fairq_time_to_first_token_seconds`` histograms), the
completion tokens per second overall and per team (``fairq_tokens_total`` and
``fairq_team_tokens_total``, whose team label is already bounded), the users served the most
(from the recent service, the figures of ``fairq top``; five per sample), the five teams
and five users with the most requests queued, with their longest wait (up to
:data:`MAX_WALK` queued users; beyond, the model's totals only), and the mean queue wait and
time to first token of the five teams and five users who waited the most in the interval,
and of all the other teams and users together (groups ``team`` and ``user``; summed on the
requests' path by :class:`~fairq_server.tenancy.waits.WaitTally`, bounded).

Bounded: at most ``points`` samples are kept (a :class:`collections.deque`), and every sample
holds a bounded number of figures (models and tiers are the configuration's, teams the
metric's bounded label set or five, users five). A sample reads a few metric families and
walks the running requests and the queued users' heads (at most :data:`MAX_WALK`); nothing
is on a request's path.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Metric

from fairq_server.core import FairqCore
from fairq_server.observe.recent import RecentService
from fairq_server.tenancy.waits import Interval, Sums

__all__ = ["LiveHistory", "Trend"]

K = TypeVar("K")

#: Users (and teams) kept per sample: the most served, the most queued.
TOP_USERS = 5
#: Queued users past which a sample leaves out the per-team and per-user queue lines (the
#: walk over every queued user's head would cost milliseconds every sample).
MAX_WALK = 2_000


@dataclass(frozen=True)
class Trend:
    """One figure over the kept samples.

    Attributes:
        group: what it is about (``model sim``, ``tier batch``, ``all``, ``team ops``,
            ``user ann``).
        name: the figure (``queued``, ``running``, ``queue wait``, ``time to first token``,
            ``tokens/s``).
        unit: its unit (``doors``, ``s``, ``tokens/s``).
        values: one per sample, oldest first (None: nothing to say then, e.g. no request
            reached a backend in that interval, or the user was not among the top ones).

    """

    group: str
    name: str
    unit: str
    values: list[float | None]


class LiveHistory:
    """Samples of the console's trends; see the module's docstring.

    Args:
        core: the scheduling core (read only).
        recent: the recent service per user.
        points: samples kept.

    """

    def __init__(self, core: FairqCore, recent: RecentService, points: int = 360) -> None:
        self._core = core
        self._recent = recent
        self._samples: deque[tuple[float, dict[tuple[str, str, str], float]]] = deque(
            maxlen=max(2, points)
        )
        self._last: tuple[float, dict[tuple[str, str], float]] | None = None
        self.seq = 0  # samples taken: a renderer caches by it

    @property
    def times(self) -> list[float]:
        """The kept samples' times (Unix seconds), oldest first."""
        return [at for at, _ in self._samples]

    def resize(self, points: int) -> None:
        """Keep at most ``points`` samples from now on (a reload)."""
        if self._samples.maxlen != max(2, points):
            self._samples = deque(self._samples, maxlen=max(2, points))

    def sample(self, now: float | None = None) -> None:
        """Take one sample now (on the event loop)."""
        now = time.time() if now is None else now
        figures: dict[tuple[str, str, str], float] = {}
        core = self._core
        running: dict[str, int] = {}
        for tickets in core.dispatcher.attempts.on_backend.values():
            for ticket in tickets:
                running[ticket.request.model] = running.get(ticket.request.model, 0) + 1
        # Per team and per user: requests queued and the oldest head, over every model.
        users: dict[str, list[float]] = {}  # user -> [queued, oldest head's arrival]
        teams: dict[str | None, list[float]] = {}
        walk = 0
        for model in core.dispatcher.model_states():
            figures[(f"model {model.name}", "queued", "requests")] = float(len(model.queue))
            figures[(f"model {model.name}", "running", "requests")] = float(
                running.get(model.name, 0)
            )
            walk += sum(t.active_users for t in model.queue.tiers)
        if walk <= MAX_WALK:
            for model in core.dispatcher.model_states():
                for tier_queue in model.queue.tiers:
                    for user in tier_queue.users():
                        head = tier_queue.head_of(user)
                        count, arrival = float(tier_queue.user_len(user)), head.arrival
                        _add(users, user, count, arrival)
                        _add(teams, head.team, count, arrival)
        mono = time.monotonic()
        named = {f"team {t if t is not None else 'none'}": v for t, v in teams.items()}
        for table in (named, {f"user {u}": v for u, v in users.items()}):
            # The most queued: a bounded number of lines however many wait.
            for group, (count, arrival) in heapq.nlargest(
                TOP_USERS, table.items(), key=lambda kv: kv[1][0]
            ):
                figures[(group, "queued", "requests")] = count
                figures[(group, "longest wait", "s")] = max(0.0, mono - arrival)
        telemetry = core.telemetry
        counters: dict[tuple[str, str], float] = {}
        _histogram(telemetry.queue_wait.collect(), "wait", counters)
        _histogram(telemetry.ttft.collect(), "ttft", counters)
        _completion(telemetry.tokens.collect(), "", counters)
        _completion(telemetry.team_tokens.collect(), "team", counters)
        if self._last is not None:
            before, then = self._last
            elapsed = max(1e-6, now - before)
            for tier in (t.name for t in core.config.tiers):
                for kind, name in (("wait", "queue wait"), ("ttft", "time to first token")):
                    count = counters.get((f"{kind}_count", tier), 0.0) - then.get(
                        (f"{kind}_count", tier), 0.0
                    )
                    if count > 0:
                        total = counters.get((f"{kind}_sum", tier), 0.0) - then.get(
                            (f"{kind}_sum", tier), 0.0
                        )
                        figures[(f"tier {tier}", name, "s")] = total / count
            for (kind, label), value in counters.items():
                if kind == "tokens":
                    group = f"team {label}" if label else "all"
                    rate = max(0.0, value - then.get((kind, label), 0.0)) / elapsed
                    figures[(group, "tokens/s", "tokens/s")] = rate
        _waits(telemetry.waits.take(), figures)
        served = self._recent.values()
        for user, value in heapq.nlargest(TOP_USERS, served.items(), key=lambda kv: kv[1]):
            # About the last minute's rate: a decayed total over its time constant.
            figures[(f"user {user}", "tokens/s", "tokens/s")] = value / self._recent.tau
        self._last = (now, counters)
        self._samples.append((now, figures))
        self.seq += 1

    def trends(self) -> list[Trend]:
        """Return every figure seen in the kept samples, by group then name."""
        keys: dict[tuple[str, str, str], None] = {}
        for _, figures in self._samples:
            keys.update(dict.fromkeys(figures))
        return [
            Trend(group, name, unit, [figures.get((group, name, unit)) for _, figures in
                                      self._samples])
            for group, name, unit in sorted(keys, key=_order)
        ]  # fmt: skip


def _waits(interval: Interval, figures: dict[tuple[str, str, str], float]) -> None:
    """Add the mean wait and time to first token of the teams and users who waited the most.

    :data:`TOP_USERS` of each, and all the others together (group ``team`` or ``user`` alone:
    no name can be empty, so it is told apart from every named one).
    """
    teams = {f"team {t if t is not None else 'none'}": v for t, v in interval.teams.items()}
    users = {f"user {u}": v for u, v in interval.users.items()}
    for kind, table, untracked in (
        ("team", teams, interval.other_teams),
        ("user", users, interval.other_users),
    ):
        top = heapq.nlargest(TOP_USERS, table.items(), key=lambda kv: kv[1].weight)
        rest = Sums()
        rest.add(untracked)
        if len(table) > len(top):
            chosen = {group for group, _ in top}
            for group, sums in table.items():
                if group not in chosen:
                    rest.add(sums)
        for group, sums in [*top, (kind, rest)]:
            if sums.waits:
                figures[(group, "queue wait", "s")] = sums.wait / sums.waits
            if sums.firsts:
                figures[(group, "time to first token", "s")] = sums.ttft / sums.firsts


def _add(table: dict[K, list[float]], key: K, count: float, arrival: float) -> None:
    entry = table.get(key)
    if entry is None:
        table[key] = [count, arrival]
    else:
        entry[0] += count
        entry[1] = min(entry[1], arrival)


def _order(key: tuple[str, str, str]) -> tuple[int, bool, str, str]:
    kinds = ("all", "model", "tier", "team", "user")
    group, name, _ = key
    kind = group.split(" ", 1)[0]
    # A kind's "others" (the group without a name) after its named groups.
    return kinds.index(kind), group == kind and kind in ("team", "user"), group, name


def _histogram(families: Iterable[Metric], kind: str, out: dict[tuple[str, str], float]) -> None:
    """Add a histogram's sums and counts per tier to ``out``."""
    for family in families:
        for s in family.samples:
            if s.name.endswith("_sum"):
                out[(f"{kind}_sum", s.labels.get("tier", ""))] = s.value
            elif s.name.endswith("_count"):
                out[(f"{kind}_count", s.labels.get("tier", ""))] = s.value


def _completion(families: Iterable[Metric], label: str, out: dict[tuple[str, str], float]) -> None:
    """Add a token counter's completion tokens (per ``label``'s value; "" : summed) to ``out``."""
    for family in families:
        for s in family.samples:
            if s.name.endswith("_total") and s.labels.get("kind") == "completion":
                key = ("tokens", s.labels.get(label, "") if label else "")
                out[key] = out.get(key, 0.0) + s.value
