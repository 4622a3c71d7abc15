"""One replica's live queues and backends, read from the core into plain values.

The console reads here what ``GetQueueSnapshot`` reads (the dispatcher's queues, the backends'
state and gate, the recent service per user), with more detail per user: where its next
request stands, how long it has waited, and its share of recent service against its
entitlement. Everything is read synchronously on the event loop, so the figures are of one
moment; the result holds no reference into the core.

Entitlement: what the fairness rule owes the user among every user contending (queued, or
with a request running): its team's weight over the contending teams', times its weight over
its contending teammates' (a user without a team is its own team), taken over the same
decaying minute as the share (:mod:`fairq_server.observe.entitled`). Users with requests
running and none queued are listed too (after the waiting ones), so a user served at once is
seen with its share. Each row says why the user waits (:data:`STATES`); it is *over* when its
share exceeds its entitlement by a quarter while someone else contends; *starved* when,
held by no limit, its next request has waited ``starved_after`` seconds and it received less
than half its entitlement.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from prometheus_client import Metric

from fairq_server.config.schema import Config
from fairq_server.core import FairqCore
from fairq_server.observe.entitled import EntitledWindow
from fairq_server.observe.recent import RecentService
from fairq_server.scheduling.ticket import Ticket
from fairq_server.tenancy.standing import OVER, LimitRow, StandingReader, TeamRow

__all__ = ["STATES", "BackendRow", "LiveView", "ModelRow", "UserRow", "read_live"]

OVER_FACTOR = 1.25
STARVED_FACTOR = 0.5
#: Starved needs a shortfall of entitlement the page can show (it rounds to whole percents).
STARVED_MIN_SHORTFALL = 0.01

#: Why a listed user waits (or that it does not: running).
RUNNING = "running"
QUEUED = "queued: its turn"
QUEUED_BUSY = "queued: no backend admits its tier"
HELD_BAND = "held: soft-quota band"
HELD_QUOTA = "held: quota"
STATES = (RUNNING, QUEUED, QUEUED_BUSY, HELD_BAND, HELD_QUOTA)


@dataclass(frozen=True)
class UserRow:
    """One user's queued or running work in one tier of one model.

    Attributes:
        tier: the tier's name.
        user: the user.
        team: its team from the key configuration ("" when none is known).
        queued: its requests queued in this tier.
        position: requests of other users served before its next one (an estimate: every
            higher tier's queue, then one request of each user ahead of it in the tier); -1
            for a user with nothing queued.
        waiting_seconds: how long its next request has waited (0: nothing queued).
        weight: its fairness weight.
        share: its part of the service (tokens) all users received lately (0-1).
        entitled: what the fairness rule owed it over the same window as ``share`` (0-1):
            among the users contending at each moment, its team's part by team weight, then
            its part of that by its weight (see :mod:`fairq_server.observe.entitled`).
        status: ``over``, ``starved`` or empty.
        preempted: how often its next request was preempted already (a continuation waiting
            for a slot; 0 for a request not yet started).
        team_weight: its team's weight against the other teams.
        limits: each quota and budget that holds for it (its own and its team's), with its
            use now (empty: none is configured).
        running: its requests running now (dispatched from this tier).
        state: why it waits, or that it does not: one of :data:`STATES`.

    """

    tier: str
    user: str
    team: str
    queued: int
    position: int
    waiting_seconds: float
    weight: float
    share: float
    entitled: float
    status: str
    preempted: int = 0
    team_weight: float = 1.0
    limits: list[LimitRow] = field(default_factory=list)
    running: int = 0
    state: str = ""


@dataclass(frozen=True)
class ModelRow:
    """One model's queue and running work.

    Attributes:
        model: the model.
        tiers: requests queued per tier.
        users: users with a request queued.
        rows: the users listed: the first ``max_users`` waiting, by position, then as many
            with requests running and none queued.
        running: requests running.
        running_users: users with a request running.

    """

    model: str
    tiers: list[tuple[str, int]]
    users: int
    rows: list[UserRow]
    running: int = 0
    running_users: int = 0

    @property
    def queued(self) -> int:
        """Requests queued over all tiers."""
        return sum(n for _, n in self.tiers)


@dataclass(frozen=True)
class BackendRow:
    """One backend's state as the scheduler sees it.

    Attributes:
        id: the backend's id.
        models: the models it serves.
        health: ``up``, ``suspect``, ``down`` or ``unknown``; ``stale`` when its last
            metrics are older than the gate accepts.
        running: requests running there, from its metrics (None: no metrics, or it is down or
            unknown, when the last figures would be old news).
        waiting: requests waiting there, from its metrics (None: as ``running``).
        kv_usage: its KV-cache usage (0-1) if reported (None: as ``running``).
        in_flight: this replica's requests on it.
        peer_in_flight: the other replicas' requests on it (cluster only).
        tpot_seconds: its recent time per output token (None: not measured).
        gates: per tier, the gate's verdict now and the tier's TPOT limit.
        draining: deregistered, finishing what it runs.
        error: the last scrape error while unhealthy, in one line (see :func:`reason`).
        preemptions: this replica's preemptions there since it started, by reason.
        regenerated_tokens: the tokens those preempted requests' continuations read again.
        resumed: per user, its requests running there now that were preempted before.

    """

    id: str
    models: list[str]
    health: str
    running: float | None
    waiting: float | None
    kv_usage: float | None
    in_flight: int
    peer_in_flight: int
    tpot_seconds: float | None
    gates: list[tuple[str, str, float | None]]
    draining: bool
    error: str
    preemptions: list[tuple[str, int]] = field(default_factory=list)
    regenerated_tokens: int = 0
    resumed: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class LiveView:
    """One replica's view at one moment."""

    replica: str
    taken_at: float
    tiers: list[str]
    models: list[ModelRow] = field(default_factory=list)
    backends: list[BackendRow] = field(default_factory=list)
    contending: int = 0
    teams: list[TeamRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Return the view as JSON-ready values (what a replica publishes)."""
        return asdict(self)


def read_live(
    core: FairqCore,
    recent: RecentService,
    *,
    replica: str = "",
    starved_after: float = 10.0,
    max_users: int = 50,
    window: EntitledWindow | None = None,
) -> LiveView:
    """Read queues, per-user standing and backends from ``core`` now (on the event loop).

    Args:
        core: the scheduling core (read only).
        recent: the recent service per user (the same figures ``GetQueueSnapshot`` shows).
        replica: this replica's name (empty in one process).
        starved_after: seconds of waiting past which a user short of its share is starved.
        max_users: users listed per model (the first by position), and as many running ones.
        window: the entitlement over the share's window, updated here (None: a fresh one,
            which takes the moment's contenders to have held over the window).

    """
    config = core.config
    now = time.monotonic()
    tiers = [t.name for t in config.tiers]
    view = LiveView(replica=replica, taken_at=time.time(), tiers=tiers)
    served = recent.values()
    total_served = sum(served.values())
    teams, key_weights = _key_tables(config)
    team_weights = {t.name: t.weight for t in config.teams}
    entitlement = core.dispatcher.entitlement
    standing = None
    if entitlement is not None and entitlement.active:
        standing = StandingReader(entitlement, team_weights)

    def of_key(user: str) -> tuple[float, str | None, float]:
        team = teams.get(user)
        return key_weights.get(user, 1.0), team, team_weights.get(team, 1.0) if team else 1.0

    # Every user waiting or running now, with its weight, team and team weight (a queued
    # ticket's, a running one's, else its key's).
    contenders: dict[str, tuple[float, str | None, float]] = {}
    # model -> tier index -> user -> requests running there
    running: dict[str, list[dict[str, int]]] = {}
    for tickets in core.dispatcher.attempts.on_backend.values():
        for ticket in tickets:
            on_tiers = running.setdefault(ticket.request.model, [{} for _ in tiers])
            if 0 <= ticket.tier < len(on_tiers):
                count = on_tiers[ticket.tier]
                count[ticket.user] = count.get(ticket.user, 0) + 1
            contenders[ticket.user] = (ticket.weight, ticket.team, ticket.team_weight)
    for backend in core.backends():
        for user in backend.user_in_flight:
            contenders.setdefault(user, of_key(user))
    # model -> tier index -> [(user, queued, head arrival, weight)]
    queued: dict[str, list[list[tuple[str, int, float, float]]]] = {}
    team_of: dict[str, tuple[str | None, float]] = {}  # user -> its head's team and weight
    preempted: dict[tuple[str, int, str], int] = {}  # (model, tier, user) -> its head's
    for model in sorted(core.dispatcher.model_states(), key=lambda m: m.name):
        per_tier = []
        for index, tier in enumerate(model.queue.tiers):
            entries = []
            for user in list(tier.users()):
                head = tier.head_of(user)
                if head.progress is not None and head.progress.preemptions:
                    preempted[(model.name, index, user)] = head.progress.preemptions
                entries.append((user, tier.user_len(user), head.arrival, head.weight))
                team_of[user] = (head.team, head.team_weight)
                contenders[user] = (head.weight, head.team, head.team_weight)
            per_tier.append(entries)
        queued[model.name] = per_tier
    owed = _owed(contenders)
    view.contending = len(contenders)
    # Share and entitlement over the same window (see observe/entitled.py).
    window = window if window is not None else EntitledWindow(recent.tau)
    moment = recent.clock()
    since = window.last_reading
    between = recent.recorded_since(since) if since is not None else []
    interval = owed
    if any(u not in contenders for u in between):
        interval = _owed({**{u: of_key(u) for u in between}, **contenders})
    window.update(moment, recent.total(), owed, interval)
    gates = _open_tiers(core, now)

    def share_of(user: str) -> float:
        return served.get(user, 0.0) / total_served if total_served else 0.0

    for name in sorted(set(queued) | set(running)):
        in_tiers = queued.get(name) or [[] for _ in tiers]
        runs = running.get(name) or [{} for _ in tiers]
        waiting: list[UserRow] = []
        only_running: list[UserRow] = []
        ahead = 0
        waiting_users: set[str] = set()
        for index, (tier_name, entries) in enumerate(zip(tiers, in_tiers, strict=True)):
            # Served in turn, one request each: the longest-waiting head goes first.
            entries.sort(key=lambda e: e[2])
            admits = gates.get((name, index), False)
            for rank, (user, n, arrival, weight) in enumerate(entries):
                waiting_users.add(user)
                waited = max(0.0, now - arrival)
                team, team_weight = team_of[user]
                waiting.append(
                    _user_row(
                        tier_name, user, team or teams.get(user, ""), n, ahead + rank, waited,
                        weight, share_of(user), window.entitled(user), team_weight,
                        runs[index].get(user, 0) if index < len(runs) else 0,
                        preempted.get((name, index, user), 0),
                        QUEUED if admits else QUEUED_BUSY,
                    )
                )  # fmt: skip
            ahead += sum(e[1] for e in entries)
            queued_here = {e[0] for e in entries}
            for user, n in sorted(runs[index].items() if index < len(runs) else ()):
                if user not in queued_here:
                    weight, team, team_weight = contenders.get(user, of_key(user))
                    only_running.append(
                        _user_row(
                            tier_name, user, team or "", 0, -1, 0.0, weight, share_of(user),
                            window.entitled(user), team_weight, n, 0, RUNNING,
                        )
                    )  # fmt: skip
        waiting.sort(key=lambda r: (r.position, r.user))
        only_running.sort(key=lambda r: (-r.running, r.user))
        rows = waiting[:max_users] + only_running[:max_users]
        if standing is not None:  # only the users listed: the view's cost stays bounded
            rows = [
                replace(r, limits=standing.for_user(r.user, r.team or None, name)) for r in rows
            ]
        others = len(contenders) > 1
        rows = [replace(r, **_judge(r, others, starved_after)) for r in rows]
        running_users = {u for tier_runs in runs for u in tier_runs}
        view.models.append(
            ModelRow(
                name,
                [(t, sum(e[1] for e in entries)) for t, entries in zip(tiers, in_tiers,
                                                                      strict=True)],
                len(waiting_users),
                rows,
                running=sum(n for tier_runs in runs for n in tier_runs.values()),
                running_users=len(running_users),
            )
        )  # fmt: skip
    view.backends = _backends(core, now)
    if standing is not None:
        view.teams = standing.teams()
    return view


def _user_row(
    tier: str, user: str, team: str, queued: int, position: int, waited: float, weight: float,
    share: float, entitled: float, team_weight: float, running: int, preempted: int, state: str,
) -> UserRow:  # fmt: skip
    return UserRow(
        tier, user, team, queued, position, round(waited, 3), weight, round(share, 4),
        round(entitled, 4), "", preempted, team_weight, running=running, state=state,
    )  # fmt: skip


def _judge(row: UserRow, others: bool, starved_after: float) -> dict[str, Any]:
    """Return a listed row's state (why it waits) and status (over, starved or none).

    A hard limit reached holds the user's requests (each is refused at its turn), a soft one
    puts them in the idle-only band: either says why it waits better than its position does.
    *Over*: its share exceeds its entitlement by a quarter while someone else contends.
    *Starved*: not held by a limit, its next request waited ``starved_after`` seconds, and it
    received less than half its entitlement, short by a point the page can show (1 %): with
    thousands of users at 0 % / 0 %, a wait is its turn, not starvation.
    """
    state = row.state
    if row.queued:
        if any(lim.mode == "hard" and lim.state == OVER for lim in row.limits):
            state = HELD_QUOTA
        elif any(lim.mode == "soft" and lim.state == OVER for lim in row.limits):
            state = HELD_BAND
    status = ""
    if row.share > OVER_FACTOR * row.entitled and others:
        status = "over"
    elif (
        row.queued
        and state in (QUEUED, QUEUED_BUSY)
        and row.waiting_seconds >= starved_after
        and row.share < STARVED_FACTOR * row.entitled
        and row.entitled - row.share >= STARVED_MIN_SHORTFALL
    ):
        status = "starved"
    return {"state": state, "status": status}


def _open_tiers(core: FairqCore, now: float) -> dict[tuple[str, int], bool]:
    """Return, per model and tier, whether some backend's gate admits that tier now."""
    config = core.config
    gate = core.policies.gate
    stale_after = config.scheduler.stale_after_seconds
    out: dict[tuple[str, int], bool] = {}
    for state in core.backends():
        for index, tier in enumerate(config.tiers):
            admits = None
            for model in state.backend.models:
                if out.get((model, index)):
                    continue
                if admits is None:  # a pure check, as in the backends view
                    admits = gate.check(state, tier, now, stale_after).value == "admit"
                out[(model, index)] = admits
    return out


def _owed(contenders: dict[str, tuple[float, str | None, float]]) -> dict[str, float]:
    """Return each contender's entitled part of the service, as the fairness rule shares it.

    Between teams by team weight, then between a team's contending users by their weights; a
    user without a team is its own team, weighted by its own weight.
    """
    groups: dict[tuple[str, str], tuple[float, float]] = {}  # team -> (its weight, users' sum)
    of: dict[str, tuple[tuple[str, str], float]] = {}
    for user, (weight, team, team_weight) in contenders.items():
        group, level = (("team", team), team_weight) if team else (("user", user), weight)
        _, members = groups.get(group, (level, 0.0))
        groups[group] = (level, members + (weight if team else 1.0))
        of[user] = (group, weight if team else 1.0)
    total = sum(level for level, _ in groups.values()) or 1.0
    return {
        user: groups[group][0] / total * (weight / (groups[group][1] or 1.0))
        for user, (group, weight) in of.items()
    }


def _key_tables(config: Config) -> tuple[dict[str, str], dict[str, float]]:
    """Return the configured keys' team and weight per user."""
    teams = {k.user: k.team for k in config.keys if k.team}
    weights = {k.user: k.weight for k in config.keys}
    return teams, weights


def _backends(core: FairqCore, now: float) -> list[BackendRow]:
    config = core.config
    stale_after = config.scheduler.stale_after_seconds
    gate = core.policies.gate
    preemptions = _per_backend(core.telemetry.preemptions.collect(), "reason")
    regenerated = _per_backend(core.telemetry.preempt_regenerated.collect(), "")
    running = core.dispatcher.attempts.on_backend
    rows = []
    for state in sorted(core.backends(), key=lambda b: b.id):
        sample = state.sample
        health = state.health.value
        if health == "up" and (sample is None or now - state.sampled_at > stale_after):
            health = "stale"
        # The gate is a pure check: asking it here changes nothing, and counts no refusal.
        gates = [
            (tier.name, gate.check(state, tier, now, stale_after).value, tier.tpot_limit_seconds)
            for tier in config.tiers
        ]
        # A down backend's last figures are from before it went down: not shown as now.
        current = sample if health not in ("down", "unknown") else None
        rows.append(
            BackendRow(
                id=state.id,
                models=list(state.backend.models),
                health=health,
                running=current.running if current else None,
                waiting=current.waiting if current else None,
                kv_usage=current.kv_usage if current else None,
                in_flight=state.in_flight,
                peer_in_flight=state.peer_in_flight,
                tpot_seconds=state.tpot_seconds,
                gates=gates,
                draining=state.draining,
                error=reason(state.last_error) if state.healthy is not True else "",
                preemptions=sorted(preemptions.get(state.id, {}).items()),
                regenerated_tokens=sum(regenerated.get(state.id, {}).values()),
                resumed=_resumed(running.get(state.id, ())),
            )
        )
    return rows


# What an operator reads for the errors a scrape meets, found in their text (a repr of an
# aiohttp or OS exception says it in a class name or an errno's words).
_REASONS = (
    (("ConnectionRefused", "Connect call failed", "Errno 111"), "connection refused"),
    (("Timeout", "timed out"), "timed out"),
    (("gaierror", "DNSError", "Name or service not known", "nodename nor servname"),
     "host name not found"),
    (("ServerDisconnected", "Connection reset", "ConnectionReset"),
     "connection closed by the backend"),
    (("SSL", "CERTIFICATE"), "TLS error"),
    (("No route to host", "Network is unreachable", "Errno 113", "Errno 101"), "host unreachable"),
)  # fmt: skip
_REPR = re.compile(r"\b[A-Z]\w*(Error|Exception|Timeout)\w*\(.*$")


def reason(error: str, limit: int = 200) -> str:
    """Return a backend's error in one line for a person: no Python representation in it.

    ``backend a: metrics unreachable: ClientConnectorError(ConnectionKey(...),
    ConnectionRefusedError(111, ...))`` becomes ``backend a: metrics unreachable: connection
    refused``; a message without a representation is kept (its first line, shortened).
    """
    lines = error.strip().splitlines()
    line = " ".join(lines[0].split()) if lines else ""
    found = _REPR.search(line)
    if found is not None:
        what = next(
            (words for marks, words in _REASONS if any(m in found.group() for m in marks)),
            found.group().split("(", 1)[0],  # at least the error's name, not its arguments
        )
        line = line[: found.start()] + what
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _per_backend(families: Iterable[Metric], label: str) -> dict[str, dict[str, int]]:
    """Return a counter's totals per backend and per ``label`` (one key "" without one)."""
    out: dict[str, dict[str, int]] = {}
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_total"):
                per = out.setdefault(sample.labels.get("backend", ""), {})
                key = sample.labels.get(label, "") if label else ""
                per[key] = per.get(key, 0) + int(sample.value)
    return out


def _resumed(tickets: Iterable[Ticket]) -> list[tuple[str, int]]:
    """Return, per user, the running requests that were preempted before (resumed ones)."""
    users: dict[str, int] = {}
    for ticket in tickets:
        if ticket.progress is not None and ticket.progress.preemptions:
            users[ticket.user] = users.get(ticket.user, 0) + 1
    return sorted(users.items())
