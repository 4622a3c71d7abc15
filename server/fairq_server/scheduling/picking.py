"""One dispatch pass: which queued request goes to which backend now.

For each model with queued work: the highest backlogged tier decides which gates must be
open (strict tiers: lower tiers wait while a higher one is refused); an aged lower tier may
overtake under that gate; a retried request goes first, to a backend it has not failed on;
otherwise fairness picks the user, with prefix grouping inside quantum Q, and the router
picks the backend. When every gate is shut only by a full backend queue, the next request
still goes to a backend where it would be boosted (fair-share priority): it will pass that
queue anyway, so holding it back would only delay it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from fairq_server.scheduling import fair_share
from fairq_server.scheduling.anticipation import LOOKS, Anticipation, model_slots, share_slots
from fairq_server.scheduling.backend_set import BackendSet
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.fairness.hierarchy import TEAM_TAG
from fairq_server.scheduling.in_force import Settings
from fairq_server.scheduling.interfaces import GateOutcome, Route
from fairq_server.scheduling.model_set import ModelSet
from fairq_server.scheduling.model_state import ModelState
from fairq_server.scheduling.queue import TierQueue
from fairq_server.scheduling.ticket import Ticket
from fairq_server.telemetry import Telemetry
from fairq_server.tenancy.checker import Entitlement

__all__ = ["Picker", "Start"]

#: Sends a ticket to a backend at a time (the attempt book's ``start``).
Start = Callable[[Ticket, BackendState, float], None]


class Picker:
    """One dispatch pass over the dispatcher's state (read here; written through ``start``).

    Args:
        settings: the dispatcher's current settings and plugins.
        models: every model's state and queue.
        backends: the registered backends.
        start: sends a popped ticket to its backend.
        telemetry: metrics sink (gate refusals).
        entitlement: quotas and budgets (the soft limits' idle-only band).
        anticipation: slots held for callers below their share (None: none are).

    """

    def __init__(
        self,
        settings: Callable[[], Settings],
        models: ModelSet,
        backends: BackendSet,
        start: Start,
        telemetry: Telemetry,
        entitlement: Entitlement | None = None,
        anticipation: Anticipation | None = None,
    ) -> None:
        self._entitlement = entitlement
        self._anticipation = anticipation
        self._settings = settings
        self._models = models
        self._backends = backends
        self._start = start
        self._telemetry = telemetry

    def dispatch(self, now: float, batch: int) -> bool:
        """Start what the gates admit, at most ``batch`` requests over all models.

        Returns:
            True if the batch was full (more may be admitted after a yield).

        """
        if self._entitlement is not None:
            self._entitlement.tick()
        started = 0
        for model in list(self._models.values()):
            while started < batch and len(model.queue):
                if not self._dispatch_one(model, now):
                    break
                started += 1
            if started >= batch:
                return True
        return False

    def _dispatch_one(self, model: ModelState, now: float) -> bool:
        queue = model.queue
        first = queue.first_tier()
        if first is None:
            return False
        # Gates are checked against the highest backlogged tier; an aged lower tier overtakes
        # under that gate, since its own may never open while the higher tier keeps the
        # backend busy.
        candidates, refusals = self._admitting(model, first, now)
        if not candidates:
            if self._boost_past_waiting(model, first, refusals, now):
                return True
            if refusals:
                self._count_refusal(model, first, refusals)
            return False  # strict tiers: lower tiers wait too; their gates are no looser
        slots = model_slots(self._backends, model.name) if self._anticipation else 0
        if slots:
            held = self._held(model, first, candidates, now)
            if held is not None:
                return held
            slots = share_slots(self._backends, model.name)
        tier = model.aged_tier(first, now, self._settings().tiers)
        tier_queue = queue.tiers[tier]
        retry = tier_queue.peek_retry() if tier_queue.has_retries else None
        router = self._settings().policies.router
        if retry is not None:
            preferred = [b for b in candidates if b.id not in retry.excluded]
            if preferred or not self._another_backend(model.name, retry):
                ticket = queue.pop(tier)
                route = router.route(ticket, preferred or candidates)
            elif tier_queue.active_users:
                # The retry waits for a backend it has not failed on; the backends admitting
                # now serve the requests behind it meanwhile.
                picked = self._pick(model, tier, candidates, slots)
                if picked is None:
                    return False
                user, route = picked
                ticket = queue.pop(tier, user)
            else:
                return False  # only a waiting retry: strict tiers keep lower ones behind it
        else:
            picked = self._pick(model, tier, candidates, slots)
            if picked is None:
                return False  # only the idle-only band here, in-quota work on another replica
            user, route = picked
            if not tier_queue.may_serve(user):
                # Cluster: a user backlogged on another replica is further behind; that
                # replica takes this slot (the shared gate gives it out), unless another
                # team here is within its own floor.
                other = tier_queue.unheld(user)
                if other is None or self._held_in_band(model, tier_queue, other):
                    return False
                user = other
                route = self._settings().policies.router.route(tier_queue.head_of(user), candidates)
            ticket = queue.pop(tier, user)
        model.last_served[tier] = now
        # An aged request is sent with the priority of the tier it overtook, so a
        # priority-scheduling backend does not let later higher-tier work pass it again.
        ticket.priority_tier = first
        self._start(ticket, route.backend, now)
        return True

    def _held(
        self, model: ModelState, first: int, candidates: list[BackendState], now: float
    ) -> bool | None:
        """Honour the slots held for callers below their share (:mod:`.anticipation`).

        Returns True when a held slot's user came back and was started, False when every free
        slot is held (nothing more starts now), None when the pass goes on as usual.
        """
        anticipation = self._anticipation
        assert anticipation is not None
        anticipation.drop(model.name, first)  # strict tiers: higher-tier work waits for none
        held = anticipation.live(model.name, now)
        if not held:
            return None
        for hold in list(held.values()):
            tier_queue = model.queue.tiers[hold.tier]
            if tier_queue.user_len(hold.user) and self._held_in_band(model, tier_queue, hold.user):
                # Over a soft limit: the idle-only band's order decides, not the hold.
                anticipation.take(model.name, hold.user, lapsed=True)
                continue
            if tier_queue.user_len(hold.user) and tier_queue.may_serve(hold.user):
                route = self._settings().policies.router.route(
                    tier_queue.head_of(hold.user), candidates
                )
                ticket = model.queue.pop(hold.tier, hold.user)
                model.last_served[hold.tier] = now
                ticket.priority_tier = first
                anticipation.claim(model.name, hold.user, ticket)  # its claim goes along
                self._start(ticket, route.backend, now)
                anticipation.take(model.name, hold.user)  # after: the user never went idle
                return True
        held = anticipation.live(model.name, now)
        free = sum(
            max(0, b.max_in_flight - b.in_flight + b.finishing - b.peer_in_flight)
            for b in candidates
        )
        return False if held and free <= len(held) else None

    def _admitting(
        self, model: ModelState, tier: int, now: float
    ) -> tuple[list[BackendState], list[tuple[BackendState, GateOutcome]]]:
        """Return the backends of ``model`` whose gate admits ``tier``, and the refusals."""
        cfg = self._settings().tiers[tier]
        gate = self._settings().policies.gate
        stale_after = self._settings().config.stale_after_seconds
        admitted: list[BackendState] = []
        refusals: list[tuple[BackendState, GateOutcome]] = []
        for backend in self._backends.of(model.name):
            outcome = gate.check(backend, cfg, now, stale_after)
            if outcome is GateOutcome.ADMIT:
                admitted.append(backend)
            else:
                refusals.append((backend, outcome))
        return admitted, refusals

    def _boost_past_waiting(
        self,
        model: ModelState,
        tier: int,
        refusals: list[tuple[BackendState, GateOutcome]],
        now: float,
    ) -> bool:
        """Start the fair choice of ``tier`` past a full backend queue, if boosted there.

        Only where the gate refused for the queue alone, and only as far as the cap on boosted
        requests lets that queue grow: every other check of the gate still applies. The user
        is one fairness may serve now: within Q (prefix grouping's quantum) of the best.
        """
        full = [
            b for b, outcome in refusals if outcome is GateOutcome.WAITING and fair_share.enabled(b)
        ]
        queue = model.queue.tiers[tier]
        if (
            not full
            or queue.has_retries
            or not queue.active_users
            or model.aged_tier(tier, now, self._settings().tiers) != tier
        ):
            return False
        cfg = self._settings().tiers[tier]
        deeper = dataclasses.replace(
            cfg, max_backend_waiting=max(cfg.max_backend_waiting, 1) + fair_share.MAX_BOOSTED
        )
        gate, sched = self._settings().policies.gate, self._settings().config
        # Users tied at the best standing (within Q) are equally fair to serve next; a user
        # arriving at a busy tier is often tied with the one fairness would pick.
        for user in queue.fairness.candidates(sched.prefix_quantum, sched.prefix_candidates):
            backends = [
                b
                for b in full
                if fair_share.may_boost(b, user)
                and gate.check(b, deeper, now, sched.stale_after_seconds) is GateOutcome.ADMIT
            ]
            if backends:
                break
        else:
            return False
        route = self._settings().policies.router.route(queue.head_of(user), backends)
        ticket = model.queue.pop(tier, user)
        model.last_served[tier] = now
        ticket.priority_tier = tier
        self._start(ticket, route.backend, now)
        return True

    def _count_refusal(
        self, model: ModelState, tier: int, refusals: list[tuple[BackendState, GateOutcome]]
    ) -> None:
        """Count a refused dispatch attempt, once per request that was next in line."""
        head = self._head(model, tier)
        if head is None or head.refused:
            return
        head.refused = True
        counter = self._telemetry.gate_refusals
        for backend, outcome in refusals:
            counter.labels(backend.id, outcome.value).inc()

    @staticmethod
    def _head(model: ModelState, tier: int) -> Ticket | None:
        tier_queue = model.queue.tiers[tier]
        if tier_queue.has_retries:
            return tier_queue.peek_retry()
        if not tier_queue.active_users:
            return None
        return tier_queue.head_of(tier_queue.fairness.select())

    def _another_backend(self, model: str, ticket: Ticket) -> bool:
        """Whether a usable backend of ``model`` exists that ``ticket`` has not failed on."""
        return any(
            b.id not in ticket.excluded and b.healthy is not False and not b.draining
            for b in self._backends.of(model)
        )

    def _pick(
        self, model: ModelState, tier: int, candidates: list[BackendState], slots: int = 0
    ) -> tuple[str, Route] | None:
        """Choose the user to serve and its backend (prefix grouping within quantum Q).

        With Q = 0 the fairness policy's choice stands and only the backend is chosen by the
        router. With Q > 0, any user whose standing is within Q of the best may go instead if
        its next request has a longer prefix remembered by its routed backend; ties keep
        fairness order. Where the model's ``slots`` are known, a choice that already runs its
        slot share gives way to the first user in fairness order that runs less than its own
        (:mod:`.slot_share`): slots are shared max-min, counters order the rest.
        """
        tier_queue = model.queue.tiers[tier]
        fairness = tier_queue.fairness
        router = self._settings().policies.router
        cfg = self._settings().config
        if cfg.prefix_quantum > 0:
            users = fairness.candidates(cfg.prefix_quantum, cfg.prefix_candidates)
        else:
            users = [fairness.select()]
        best: tuple[tuple[int, int], str, Route] | None = None
        for rank, user in enumerate(users):
            route = router.route(tier_queue.head_of(user), candidates)
            key = (-route.affinity, rank)
            if best is None or key < best[0]:
                best = (key, user, route)
        assert best is not None, "fairness returns at least one active user"
        user, route = best[1], best[2]
        if slots and tier_queue.outstanding.at_share(user, slots):
            for other in fairness.candidates(math.inf, LOOKS):
                if other != user and tier_queue.outstanding.below(other, slots):
                    user = other
                    route = router.route(tier_queue.head_of(other), candidates)
                    break
        if self._entitlement is not None and self._entitlement.has_soft:
            return self._out_of_band(model, tier, candidates, user, route)
        return user, route

    def _out_of_band(
        self, model: ModelState, tier: int, candidates: list[BackendState], user: str, route: Route
    ) -> tuple[str, Route] | None:
        """Keep the idle-only band behind in-quota work: pass over a user over a soft limit.

        A user (or its team) over a soft quota or budget is served only when no in-quota user
        of the same tier waits for this model; otherwise the next in-quota user in fairness
        order goes instead. One check when the fair choice is in quota (the usual case); a walk
        over the tier's users only when it is not. None: every user here is in the band and,
        in a cluster, in-quota work of the tier waits on another replica (which takes the slot).
        """
        entitlement = self._entitlement
        assert entitlement is not None
        tier_queue = model.queue.tiers[tier]
        head = tier_queue.head_of(user)
        if not entitlement.demoted(user, head.team, model.name):
            return user, route
        # Fairness order where the policy knows one (counter policies), then the rest.
        ordered = tier_queue.fairness.candidates(math.inf, tier_queue.active_users)
        listed = set(ordered)
        ordered += [u for u in tier_queue.users() if u not in listed]
        for other in ordered:
            if other == user:
                continue
            ticket = tier_queue.head_of(other)
            if not entitlement.demoted(other, ticket.team, model.name):
                entitlement.count_demotion(served_from_band=False)
                return other, self._settings().policies.router.route(ticket, candidates)
        if self._in_quota_elsewhere(tier_queue):
            return None
        entitlement.count_demotion(served_from_band=True)
        return user, route

    def _held_in_band(self, model: ModelState, tier_queue: TierQueue, user: str) -> bool:
        """Whether ``user`` is in the idle-only band (over a soft limit) while others wait."""
        entitlement = self._entitlement
        if entitlement is None or not entitlement.has_soft:
            return False
        return entitlement.demoted(user, tier_queue.head_of(user).team, model.name)

    @staticmethod
    def _in_quota_elsewhere(tier_queue: TierQueue) -> bool:
        """Whether another replica has in-quota work of this tier waiting (cluster only).

        A replica's heads leave out its entries in the idle-only band (see :meth:`in_band`),
        so any head is in-quota work.
        """
        return bool(tier_queue.counters.peer_heads.pairs)

    def in_band(self, model: str, tier_queue: TierQueue) -> Callable[[str], bool] | None:
        """Which entries of ``tier_queue`` are in the idle-only band (None: no soft limits).

        Entries are a tier's unit between replicas: users without a team, or teams, and a team
        is in the band when every one of its users backlogged here is; and team members'
        counters (the team's key, a unit separator, the user), each in the band with its user.
        """
        entitlement = self._entitlement
        if entitlement is None or not entitlement.has_soft:
            return None

        def in_band(entry: str) -> bool:
            team = entry[len(TEAM_TAG) :] if entry.startswith(TEAM_TAG) else None
            if team is not None:
                team, member, user = team.partition("\x1f")  # team names hold no 0x1F
                if member:
                    return entitlement.demoted(user, team, model)
            members = tier_queue.members(entry)
            return bool(members) and all(entitlement.demoted(u, team, model) for u in members)

        return in_band
