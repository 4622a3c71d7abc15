"""What the dispatcher knows about one backend: load, latest metrics and health.

The dispatcher is the only writer. Scrape outcomes and stream events reach it as events, and
it applies them here; everything else (the gate, routing, the Admin API, telemetry) reads.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, field

from fairq_server.backends.base import Backend
from fairq_server.backends.request import MetricsSample
from fairq_server.errors import BackendError
from fairq_server.scheduling.metric_gaps import Gap, describe, gaps
from fairq_server.scheduling.prefix import PrefixCache

__all__ = ["BackendState", "Health"]

log = logging.getLogger(__name__)


class Health(enum.Enum):
    """A backend's health, one state machine fed by scrapes and by requests.

    ``UNKNOWN`` until the first scrape answers; ``UP`` after a good scrape; ``SUSPECT`` when a
    request could not reach it although scrapes were fine (no new work until the next good
    scrape, but requests are still accepted: it is not known to be down); ``DOWN`` after
    ``unhealthy_after`` consecutive failed scrapes (the first, for a backend that never
    answered): requests for a model whose every backend is down are refused UNAVAILABLE.
    """

    UNKNOWN = "unknown"
    UP = "up"
    SUSPECT = "suspect"
    DOWN = "down"


@dataclass(eq=False)
class BackendState:
    """Live state of one registered backend.

    Attributes:
        backend: the adapter (how to reach the backend, and what it serves).
        prefixes: prefix blocks recently sent to it.
        sample: the last successful scrape, None before the first.
        sampled_at: monotonic time that scrape was sent.
        awaiting_mark: fairq's requests to it without a token yet when that scrape was sent
            (the part of ``sample.waiting`` that is fairq's own).
        tpot_seconds: mean time per output token over the last scrape window (None if no
            request finished in it while nothing ran).
        health: see :class:`Health`.
        draining: deregistered; takes no new work, finishes what it runs.
        in_flight: fairq's requests running on it.
        awaiting_first_token: those without a token yet (waiting in its queue, or prefill).
        tier_in_flight: ``in_flight`` by tier name.
        user_in_flight: ``in_flight`` by user (users with none are absent).
        boosted_in_flight: those sent with a fair-share boost (:mod:`.fair_share`).
        finishing: those about to reach their ``max_tokens``, whose slots count as free
            (:mod:`.lookahead`).
        dispatched: requests ever started on it.
        finished: requests ever ended on it (any way).
        idle: set while ``in_flight`` is 0.
        peer_awaiting: other replicas' requests on it without a token yet (cluster only;
            from the last read of the shared gate).
        peer_in_flight: other replicas' requests running on it (cluster only).
        share: the part of the tier thresholds and in-flight caps this replica may use on
            its own (1: all of it; below 1 while the cluster's shared gate is unreachable).

    """

    backend: Backend
    prefixes: PrefixCache
    sample: MetricsSample | None = None
    sampled_at: float = 0.0
    awaiting_mark: int = 0
    tpot_seconds: float | None = None
    health: Health = Health.UNKNOWN
    draining: bool = False
    in_flight: int = 0
    awaiting_first_token: int = 0
    tier_in_flight: dict[str, int] = field(default_factory=dict)
    user_in_flight: dict[str, int] = field(default_factory=dict)
    boosted_in_flight: int = 0
    finishing: int = 0
    dispatched: int = 0
    finished: int = 0
    scrapes: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_error: str = ""
    # Figures the configuration relies on that the backend's /metrics lacks (metric_gaps).
    metric_gaps: tuple[Gap, ...] = ()
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    peer_awaiting: int = 0
    peer_in_flight: int = 0
    share: float = 1.0
    _sent_at: float = 0.0
    _sent_mark: int = 0
    # Cluster: the shared gate was lost at this time; the peers' last counts stand until a
    # scrape sent since then lands (it shows their requests as other clients'). None: not so.
    _peers_lost_at: float | None = None
    _previous: MetricsSample | None = None
    _last_tpot: float | None = None

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def id(self) -> str:
        """The backend's id."""
        return self.backend.id

    @property
    def max_in_flight(self) -> int:
        """The backend's own cap on fairq's requests (0: none)."""
        return self.backend.max_in_flight

    @property
    def healthy(self) -> bool | None:
        """True when up, False when suspect or down, None before the first scrape answered."""
        return None if self.health is Health.UNKNOWN else self.health is Health.UP

    @property
    def reason(self) -> str:
        """Why it is unhealthy, or else what its metrics lack ("" if nothing)."""
        if self.healthy is not True:
            return self.last_error
        return describe(self.metric_gaps) if self.metric_gaps else ""

    def _note_gaps(self, found: tuple[Gap, ...]) -> None:
        """Record the metric gaps a scrape showed; log when they change."""
        if found == self.metric_gaps:
            return
        if found:
            log.warning("backend %s: %s", self.id, describe(found))
        else:
            log.info("backend %s: its /metrics has every figure relied on again", self.id)
        self.metric_gaps = found

    @property
    def serving(self) -> bool:
        """Whether requests for it are accepted at all (not known down, not draining)."""
        return self.health is not Health.DOWN and not self.draining

    def suspect(self) -> None:
        """Mark that a request could not reach it: no new work until the next good scrape."""
        if self.health is Health.UP:
            self.health = Health.SUSPECT

    def scrape_sent(self, now: float) -> None:
        """Remember when a scrape left, and how many of fairq's requests lacked a token.

        In a cluster, fairq's requests are every replica's: the scraped queue holds theirs too.
        """
        self._sent_at = now
        peers = 0 if self._peers_lost_at is not None else self.peer_awaiting
        self._sent_mark = self.awaiting_first_token + peers

    def peer_view(self, awaiting: int, in_flight: int, share: float, now: float) -> None:
        """Apply the other replicas' counts and this replica's share (cluster only).

        When the shared gate is lost (``share`` drops below 1 with no counts), the other
        replicas' requests are known only from the last counts until a scrape sent from now
        on lands: until then the backend would look emptier than it is, so those counts
        stand (erring closed for at most one scrape interval).
        """
        if share < 1 and not awaiting and not in_flight:  # on the local share
            if self.share >= 1:  # just lost
                self._peers_lost_at = now
            self.share = share
            if self._peers_lost_at is None:
                self.peer_awaiting = self.peer_in_flight = 0
            return
        self._peers_lost_at = None
        self.peer_awaiting, self.peer_in_flight, self.share = awaiting, in_flight, share

    def scrape_landed(
        self,
        result: MetricsSample | BackendError,
        unhealthy_after: int,
        relied: frozenset[str] = frozenset(),
    ) -> None:
        """Apply a scrape's outcome: a fresh sample, or one more failure.

        ``relied`` names the figures the tiers' limits read (see :mod:`.metric_gaps`).
        """
        if isinstance(result, BackendError):
            self._scrape_failed(result, unhealthy_after)
            return
        self._note_gaps(gaps(result, relied))
        self.scrapes += 1
        self.consecutive_failures = 0
        if self.health is Health.DOWN:
            log.info("backend %s healthy again", self.id)
        self.health = Health.UP
        self.last_error = ""
        self.tpot_seconds = self._window_tpot(result)
        self.sample = result
        self.sampled_at = self._sent_at
        self.awaiting_mark = self._sent_mark
        lost_at = self._peers_lost_at
        if lost_at is not None and self._sent_at >= lost_at:
            # This sample counts the other replicas' requests among other clients' now.
            self._peers_lost_at = None
            self.peer_awaiting = self.peer_in_flight = 0

    def _scrape_failed(self, error: BackendError, unhealthy_after: int) -> None:
        # The old sample stays, to go stale: the gate fails closed after stale_after.
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error = str(error)
        if self.health is Health.DOWN:
            return
        n = self.consecutive_failures
        if self.health is Health.UNKNOWN or n >= unhealthy_after:
            log.warning("backend %s unhealthy after %d failed scrape(s): %s", self.id, n, error)
            self.health = Health.DOWN
        else:
            log.warning(
                "backend %s: scrape failed (%d of %d before it counts as unhealthy): %s",
                self.id,
                n,
                unhealthy_after,
                error,
            )

    def _window_tpot(self, sample: MetricsSample) -> float | None:
        """Time per output token between the previous scrape and ``sample``.

        A difference of two cumulative histograms, so one slow request long ago does not
        hold the gate shut.
        """
        prev, self._previous = self._previous, sample
        if prev is None:
            return None
        count = sample.tpot_count - prev.tpot_count
        if count < 0:  # the backend restarted and its counters began again
            return None
        if count == 0:
            # No request finished in this window: keep the last measurement while work is
            # running, so a saturated backend does not look fast just between completions.
            return self._last_tpot if sample.running else None
        self._last_tpot = (sample.tpot_sum - prev.tpot_sum) / count
        return self._last_tpot

    def started(self, tier: str, user: str = "", *, boosted: bool = False) -> None:
        """Count a request of ``tier`` (and ``user``; ``boosted``) started on this backend."""
        self.dispatched += 1
        self.in_flight += 1
        self.awaiting_first_token += 1
        self.tier_in_flight[tier] = self.tier_in_flight.get(tier, 0) + 1
        self.user_in_flight[user] = self.user_in_flight.get(user, 0) + 1
        self.boosted_in_flight += boosted
        self.idle.clear()

    def first_token(self) -> None:
        """Count a request that got its first token (it no longer waits there)."""
        self.awaiting_first_token -= 1

    def ended(self, tier: str, user: str = "", *, generating: bool, boosted: bool = False) -> None:
        """Count a request that ended (any way); ``generating``: it had had a token."""
        self.in_flight -= 1
        self.finished += 1
        self.tier_in_flight[tier] -= 1
        left = self.user_in_flight.get(user, 0) - 1
        if left > 0:
            self.user_in_flight[user] = left
        else:
            self.user_in_flight.pop(user, None)
        self.boosted_in_flight -= boosted
        if not generating:
            self.awaiting_first_token -= 1
        if self.in_flight == 0:
            self.idle.set()
