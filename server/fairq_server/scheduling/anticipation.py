"""Anticipation: a slot freed by a caller below its share waits a moment for that caller.

A closed-loop caller (a chat app's user, an agent with a few requests in flight) sends its next
request as soon as its last one ends, a few milliseconds later: at the instant the slot frees
it has nothing queued, and a caller with a deep backlog would take the slot for its whole
generation. That is *deceptive idleness* (Iyer and Druschel, "Anticipatory scheduling", SOSP
2001), and the answer is theirs: hold the slot for the caller whose request just ended, for a
short think time learned from its own history, before it goes to anyone else.

The rule, decided when a request ends, where fairq knows the model's slots (every backend of
the model sets ``max_in_flight``; :func:`model_slots`):

* the slot is held for the request's user if, without that request, the user (and its team)
  would run fewer requests than its slot share (:mod:`.slot_share`), the user has nothing
  queued in the tier, and no queued user of the tier is itself below its share (it would be
  served first anyway);
* the hold lasts at most ``scheduler.anticipation_seconds``, and is given only to a user whose
  think time, learned from its own history (the moving average of its gaps between a
  request's end and its next arrival), is within that bound: a user whose gaps run past it,
  or who let two holds lapse in a row, gets none until it comes back within it again. A
  returning user ends its hold when it arrives, so the slot idles for its actual gap (its
  round trip, which a direct client pays too); the bound is paid only when it does not come
  back. (Holding for a multiple of the average gap instead let 44 % of holds lapse on the
  loaded two-core machine, where gaps vary several-fold.)
* the user's next request takes the held slot whatever its counter; when the hold lapses the
  slot goes to the fair pick. A higher tier's work is never held back by a lower tier's hold.

So no slot stays idle longer than ``anticipation_seconds`` while a request waits (a property
test checks it), and a hold costs the engine at most that long once per request of a caller
below its share; a caller that always comes back costs it only its own round trip, which a
direct client pays as well. ``docs/design/fairness.md`` has the measured cost.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fairq_server.scheduling.backend_set import BackendSet
from fairq_server.scheduling.in_force import Settings
from fairq_server.scheduling.model_state import ModelState
from fairq_server.scheduling.ticket import Ticket
from fairq_server.telemetry import Telemetry

__all__ = ["MAX_REMEMBERED", "Anticipation", "Hold", "model_slots", "share_slots"]

#: Users whose think time is remembered (least recently seen forgotten first).
MAX_REMEMBERED = 65_536
#: Weight of the newest gap in the moving average.
GAP_ALPHA = 0.25
#: Holds a user may let lapse in a row before it gets none until it returns quickly again.
MAX_LAPSES = 2
#: Queued users looked at for one below its share (bounds the work per decision).
LOOKS = 8


@dataclass
class _Think:
    """One user's history: when its last request ended, and its usual gap."""

    ended_at: float | None = None
    gap: float | None = None  # moving average of the gaps seen (seconds)
    lapses: int = 0  # holds that lapsed in a row


@dataclass(frozen=True)
class Hold:
    """A slot held for ``user``'s next request of tier ``tier`` until ``until``.

    While it is held the slot stays the user's: the request that ended keeps counting as
    running in the tier (its standing and slot share) until ``release`` is called, when the
    user's next request has started in it or the hold has lapsed.
    """

    user: str
    tier: int
    until: float
    release: Callable[[], None] | None = None
    ended: Ticket | None = None  # the request whose slot it is (its slot is handed over)

    def end(self) -> None:
        """Stop counting the ended request as running (once the next one has started)."""
        if self.release is not None:
            self.release()


def model_slots(backends: BackendSet, model: str) -> int:
    """Return the running slots of ``model``'s serving backends, 0 unless all are known.

    Slots are known where a backend sets ``max_in_flight``; a model with one backend whose
    slots are unknown is decided by counters alone (the engine's queue sets the order then).
    """
    total = 0
    for backend in backends.of(model):
        if backend.draining or backend.healthy is False:
            continue
        if not backend.max_in_flight:
            return 0
        total += backend.max_in_flight
    return total


def share_slots(backends: BackendSet, model: str) -> int:
    """Return the slots of ``model`` this replica shares among its own users (0: unknown).

    On one process, every slot. In a cluster, those the other replicas' requests do not hold
    (as last read from the shared gate, their held slots included): a replica knows only its
    own users, and sharing every slot among them gave a deep caller here half the engine
    while the callers it shared it with ran on other replicas (a chat caller beside it got
    0.38 of its owed share, those elsewhere 0.96).
    """
    if not model_slots(backends, model):
        return 0
    return sum(
        max(0, b.max_in_flight - b.peer_in_flight)
        for b in backends.of(model)
        if not b.draining and b.healthy is not False
    )


class Anticipation:
    """The held slots of every model, and each user's think time (dispatcher loop only).

    Args:
        settings: the dispatcher's current settings (``anticipation_seconds``).
        backends: the registered backends (the models' slots).
        telemetry: counts holds taken and lapsed.

    """

    def __init__(
        self, settings: Callable[[], Settings], backends: BackendSet, telemetry: Telemetry
    ) -> None:
        self._settings = settings
        self._backends = backends
        self._telemetry = telemetry
        #: Hands a held slot's claim to the request taking it, or frees it (the attempt
        #: book's; a cluster keeps the slot claimed in the shared gate meanwhile).
        self.hand_over: Callable[[Ticket, Ticket], None] = lambda ended, to: None
        self.let_go: Callable[[Ticket], None] = lambda ended: None
        self._think: OrderedDict[str, _Think] = OrderedDict()
        self._holds: dict[str, dict[str, Hold]] = {}  # model -> user -> hold
        self.held = 0  # holds given, for telemetry and tests
        self.taken = 0  # holds whose user came back in time
        self.lapsed = 0  # holds that ran out

    # -- learning ----------------------------------------------------------------------------

    def _user(self, user: str) -> _Think:
        think = self._think.get(user)
        if think is None:
            think = self._think[user] = _Think()
            if len(self._think) > MAX_REMEMBERED:
                self._think.popitem(last=False)
        else:
            self._think.move_to_end(user)
        return think

    def arrived(self, ticket: Ticket, now: float) -> None:
        """Learn from a new request: its gap since its user's last request ended."""
        think = self._think.get(ticket.user)
        if think is None or think.ended_at is None:
            return
        gap = max(0.0, now - think.ended_at)
        think.ended_at = None
        think.gap = gap if think.gap is None else GAP_ALPHA * gap + (1 - GAP_ALPHA) * think.gap
        if gap <= self._bound():
            think.lapses = 0

    def _bound(self) -> float:
        return self._settings().config.anticipation_seconds

    def _hold_for(self, think: _Think) -> float:
        """Seconds to hold a slot for a user with this history (0: none)."""
        bound = self._bound()
        if think.lapses >= MAX_LAPSES or (think.gap is not None and think.gap > bound):
            return 0.0
        return bound

    # -- holding -----------------------------------------------------------------------------

    def _hold_seconds(
        self, model: ModelState, ticket: Ticket, think: _Think | None, *, others: bool = True
    ) -> float:
        """How long the slot of running ``ticket`` would wait for its user if it ended now.

        ``others``: also ask whether a queued user below its share would take it instead.
        """
        if self._bound() <= 0:
            return 0.0
        slots = share_slots(self._backends, model.name)
        if not slots:
            return 0.0
        user = ticket.user
        tier = model.queue.tiers[ticket.tier]
        if tier.user_len(user) or not tier.outstanding.below(user, slots, giving_back=1):
            return 0.0
        if others and tier.active_users:
            for other in tier.fairness.candidates(float("inf"), LOOKS):
                if tier.outstanding.below(other, slots, ending=user):
                    return 0.0  # a queued user below its share takes the slot anyway
        return self._hold_for(think if think is not None else _Think())

    def may_hold(self, model: ModelState, ticket: Ticket) -> bool:
        """Whether the slot of running ``ticket`` may be held for its user when it ends.

        Such a slot is not filled ahead of its end (:mod:`.lookahead`). Asked a few tokens
        before the end, when who else is queued below its share may still change: only the
        user's own standing is asked, and :meth:`ended` decides.
        """
        think = self._think.get(ticket.user)
        return self._hold_seconds(model, ticket, think, others=False) > 0

    def holding(self, model: str, ticket: Ticket) -> bool:
        """Whether a hold keeps the slot of ``ticket``, which has ended."""
        hold = self._holds.get(model, {}).get(ticket.user)
        return hold is not None and hold.ended is ticket

    def ended(self, model: ModelState, ticket: Ticket, now: float) -> bool:
        """Decide whether the slot of ``ticket``, ending now, waits for its user (True if so).

        Called before the request stops counting as running.
        """
        user = ticket.user
        think = self._user(user)
        think.ended_at = now
        if ticket.finishing:
            return False  # its slot was filled ahead of its end (lookahead): nothing to hold
        seconds = self._hold_seconds(model, ticket, think)
        if seconds <= 0:
            return False
        tier = model.queue.tiers[ticket.tier]
        # The ended request stays the user's until the hold ends: the user is not idle
        # between its requests, and its slot share counts the held slot. The other replicas
        # see the user among the heads meanwhile, as if its next request were queued: a
        # replica that does not know it would otherwise serve its own users past it.
        stop, ticket.stop_running = ticket.stop_running, None
        team = ticket.team
        tier.report_held(user, team, True)

        def release() -> None:
            tier.report_held(user, team, False)
            if stop is not None:
                stop()

        holds = self._holds.setdefault(model.name, {})
        old = holds.get(user)
        holds[user] = Hold(user, ticket.tier, now + seconds, release, ticket)
        if old is not None:
            self._end(old)
        self.held += 1
        return True

    def _end(self, hold: Hold) -> None:
        """End a hold nobody took: its slot is free for anyone."""
        if hold.ended is not None:
            self.let_go(hold.ended)
        hold.end()

    def live(self, model: str, now: float) -> dict[str, Hold]:
        """Return ``model``'s holds still running at ``now`` (lapsed ones are dropped)."""
        holds = self._holds.get(model)
        if not holds:
            return {}
        for user in [u for u, h in holds.items() if h.until <= now]:
            self._end(holds.pop(user))
            self.lapsed += 1
            self._telemetry.anticipation.labels(model, "lapsed").inc()
            think = self._think.get(user)
            if think is not None:
                think.lapses += 1
        if not holds:
            del self._holds[model]
            return {}
        return holds

    def claim(self, model: str, user: str, to: Ticket) -> Hold | None:
        """``to``, about to start, takes the slot held for its user: its claim goes to ``to``.

        Returns the hold, to :meth:`Hold.end` once ``to`` has started (None: no hold).
        """
        hold = self._holds.get(model, {}).get(user)
        if hold is not None and hold.ended is not None:
            self.hand_over(hold.ended, to)
        return hold

    def take(self, model: str, user: str, *, lapsed: bool = False) -> None:
        """``user``'s next request has started in the slot held for it (see :meth:`claim`).

        ``lapsed``: the hold ends without its user taking it (counted as lapsed).
        """
        holds = self._holds.get(model)
        hold = holds.pop(user, None) if holds is not None else None
        if hold is None:
            return
        if lapsed:
            self._end(hold)
            self.lapsed += 1
        else:
            hold.end()
            self.taken += 1
        self._telemetry.anticipation.labels(model, "lapsed" if lapsed else "taken").inc()
        if not holds:
            del self._holds[model]

    def drop(self, model: str, below_tier: int) -> None:
        """Drop ``model``'s holds for tiers after ``below_tier`` (higher-tier work waits)."""
        holds = self._holds.get(model)
        if holds:
            for user in [u for u, h in holds.items() if h.tier > below_tier]:
                self._end(holds.pop(user))

    def expire(self, now: float) -> None:
        """Let every hold past its time lapse, whether or not anything waits for its slot.

        A hold must end on time even with nothing queued: until it does, its user counts as
        running (and, in a cluster, as backlogged to the other replicas, which wait for it).
        """
        for model in list(self._holds):
            self.live(model, now)

    def next_deadline(self) -> float | None:
        """Return when the earliest hold lapses (None: no hold), so the loop wakes then."""
        return min((h.until for hs in self._holds.values() for h in hs.values()), default=None)
