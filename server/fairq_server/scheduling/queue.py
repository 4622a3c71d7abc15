"""The per-model queue: strict tiers, then fairness between users, then order within a user.

Removal is lazy: a removed ticket stays in its user's heap, marked, and is skipped when it
surfaces, so cancelling is O(1) and every push and pop is O(log n). Counts are kept exactly.

Each tier also counts the requests of each user that it handed out and that still run (from
:meth:`TierQueue.pop` to the ticket's :meth:`~.ticket.Ticket.stopped_running`): the fairness
policy's standing is over what a user has outstanding, queued or running, not over its queue
alone, and the slot shares (:mod:`.slot_share`) are over the same.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fairq_server.scheduling.counters import LocalCounters
from fairq_server.scheduling.fairness.hierarchy import TeamFairness
from fairq_server.scheduling.interfaces import (
    Cost,
    FairnessPolicy,
    OrderingPolicy,
    SortKey,
    TracksRunning,
)
from fairq_server.scheduling.slot_share import Outstanding
from fairq_server.scheduling.ticket import Ticket, TicketState

__all__ = ["UNHELD_LOOKS", "ModelQueue", "TierQueue"]

#: Teams :meth:`TierQueue.unheld` looks at for one that may be served (a short walk: it runs
#: on a held dispatch, and the teams furthest behind are first).
UNHELD_LOOKS = 8


@dataclass
class _Flow:
    """One user's queued tickets in one tier."""

    heap: list[tuple[SortKey, int, Ticket]] = field(default_factory=list)
    live: int = 0


class TierQueue:
    """The queue of one tier: a fairness policy over per-user flows.

    Tickets that failed on a backend before their first token are retried ahead of
    everything else in the tier (``push_front``). ``counters`` are the tier's service
    counters, which ``fairness`` keeps its standing in: the queue tells them who is
    backlogged (a cluster shares them; one process needs none).
    """

    def __init__(
        self,
        fairness: FairnessPolicy,
        ordering: OrderingPolicy,
        counters: LocalCounters | None = None,
    ) -> None:
        self.fairness = fairness
        self.counters = counters if counters is not None else LocalCounters()
        # Hierarchical fairness is told each request's team, and reports the team-level
        # entries backlogged to the counters itself.
        self._teams = fairness if isinstance(fairness, TeamFairness) else None
        if self._teams is not None:
            self._teams.report_to(self.counters)
        self._tracker = fairness if isinstance(fairness, TracksRunning) else None
        self._ordering = ordering
        self._flows: dict[str, _Flow] = {}
        #: Each user's and team's requests queued or running (handed out by this tier and not
        #: ended), for the fairness standing and slot shares.
        self.outstanding = Outstanding()
        self._front: deque[Ticket] = deque()
        self._removed: set[int] = set()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def user_len(self, user: str) -> int:
        """Return how many tickets ``user`` has queued in this tier."""
        flow = self._flows.get(user)
        return flow.live if flow is not None else 0

    @property
    def active_users(self) -> int:
        """Number of users with queued tickets."""
        return len(self._flows)

    def push(self, ticket: Ticket, *, resume: bool = False) -> None:
        """Queue ``ticket`` behind its user's other tickets (by the ordering policy).

        ``resume``: ``ticket`` was taken a moment ago and comes back; if its user's queue
        emptied meanwhile, the user keeps its fairness standing (see
        :meth:`FairnessPolicy.activate`).
        """
        flow = self._flows.get(ticket.user)
        if flow is None:
            flow = self._flows[ticket.user] = _Flow()
            # A user with requests running was never idle (a policy that hears of running
            # requests knows that itself; for any other, it is a resumption).
            resume = resume or (self._tracker is None and self.outstanding.running(ticket.user) > 0)
            if self._teams is not None:
                self._teams.activate_in(
                    ticket.user, ticket.weight, ticket.team, ticket.team_weight, resume=resume
                )
            else:
                self.fairness.activate(ticket.user, ticket.weight, resume=resume)
                self.counters.backlogged(ticket.user, True)
        if ticket.seq in self._removed:
            # Queued, removed and now queued again (a preempted request started in its
            # slot, then preempted again): its removed entry goes now, or the removal mark
            # would hide one entry while the other stayed behind as a ghost.
            self._removed.discard(ticket.seq)
            flow.heap = [e for e in flow.heap if e[1] != ticket.seq]
            heapq.heapify(flow.heap)
        heapq.heappush(flow.heap, (self._ordering.key(ticket), ticket.seq, ticket))
        flow.live += 1
        self._len += 1
        self.outstanding.add(ticket.user, ticket.weight, ticket.team, ticket.team_weight)

    def push_front(self, ticket: Ticket) -> None:
        """Queue ``ticket`` ahead of every other ticket in the tier (a retry)."""
        self._front.append(ticket)
        self._len += 1
        self.outstanding.add(ticket.user, ticket.weight, ticket.team, ticket.team_weight)

    def remove(self, ticket: Ticket, *, start: bool = False) -> None:
        """Remove a queued ``ticket`` (it must be in this tier).

        ``start``: it is removed to run now (see :meth:`started`).
        """
        self._len -= 1
        if start:
            self.started(ticket)
        else:
            self.outstanding.dropped(ticket.user)
        if ticket in self._front:
            self._front.remove(ticket)
            return
        self._removed.add(ticket.seq)
        flow = self._flows[ticket.user]
        flow.live -= 1
        if flow.live == 0:
            for _, seq, _ in flow.heap:
                self._removed.discard(seq)
            del self._flows[ticket.user]
            self._deactivate(ticket.user)

    def peek_retry(self) -> Ticket:
        """Return the first retried ticket without removing it."""
        return self._front[0]

    @property
    def has_retries(self) -> bool:
        """True while retried tickets wait at the front of the tier."""
        return bool(self._front)

    def pop(self, user: str | None = None, *, start: bool = True) -> Ticket:
        """Remove and return the next ticket: a retry first, if any, else the fair choice.

        Args:
            user: pop this user's next ticket instead, passing over any retries (they may be
                waiting for a backend the caller is not dispatching to). It must have queued
                tickets in this tier.
            start: the ticket leaves to run (counted as running until its
                :meth:`~.ticket.Ticket.stopped_running`); False when the queue is emptied.

        Raises:
            IndexError: the tier is empty.

        """
        if self._len == 0:
            raise IndexError("pop from an empty tier queue")
        self._len -= 1
        if user is None:
            if self._front:
                ticket = self._front.popleft()
                if start:
                    self.started(ticket)
                else:
                    self.outstanding.dropped(ticket.user)
                return ticket
            user = self.fairness.select()
        flow = self._flows[user]
        while True:
            _, seq, ticket = heapq.heappop(flow.heap)
            if seq in self._removed:
                self._removed.discard(seq)
                continue
            break
        flow.live -= 1
        self.charge(ticket, Cost(requests=1, prompt_tokens=ticket.prompt_tokens))
        if start:
            self.started(ticket)  # before the user may go idle: it is not idle
        else:
            self.outstanding.dropped(ticket.user)
        if flow.live == 0:
            for _, seq, _ in flow.heap:
                self._removed.discard(seq)
            del self._flows[user]
            self._deactivate(user)
        return ticket

    def started(self, ticket: Ticket) -> None:
        """Count ``ticket`` as running for its user until its ``stopped_running()``."""
        if ticket.stop_running is not None:
            return  # already counted (a preempted request taken again, say)
        user, team = ticket.user, ticket.team
        self.outstanding.started(user)
        if self._teams is not None:
            self._teams.started_in(user, team)
        elif self._tracker is not None:
            self._tracker.started(user)
        ticket.stop_running = lambda: self._stopped(user, team, ticket)

    def _stopped(self, user: str, team: str | None, ticket: Ticket) -> None:
        self.outstanding.stopped(user, finishing=ticket.finishing)
        if self._teams is not None:
            self._teams.stopped_in(user, team)
        elif self._tracker is not None:
            self._tracker.stopped(user)

    def report_held(self, user: str, team: str | None, held: bool) -> None:
        """Count ``user`` as backlogged for the cluster's heads while a slot is held for it."""
        if user in self._flows:
            return  # backlogged anyway
        if self._teams is not None:
            self._teams.report_held(user, team, held)
        else:
            self.counters.backlogged(user, held)

    def _deactivate(self, user: str) -> None:
        self.fairness.deactivate(user)
        if self._teams is None:
            self.counters.backlogged(user, False)

    def charge(self, ticket: Ticket, cost: Cost) -> None:
        """Charge ``cost`` to ``ticket``'s user (and team) in this tier's fairness."""
        if self._teams is not None:
            self._teams.charge_in(ticket.user, cost, ticket.weight, ticket.team, ticket.team_weight)
        else:
            self.fairness.charge(ticket.user, cost, ticket.weight)

    def may_serve(self, user: str) -> bool:
        """Whether ``user`` may be served here now (cluster: see ``LocalCounters.may_serve``).

        With teams, the question is asked of the user's team-level entry, and of its member
        counter against the team's members elsewhere.
        """
        if not self.counters.shared:
            return True  # one process: nobody elsewhere to wait for
        if self._teams is None:
            return self.counters.may_serve(user)
        if not self.counters.may_serve(self._teams.level_key(user)):
            return False
        member = self._teams.member(user)
        return member is None or self.counters.may_serve_member(*member)

    def unheld(self, held: str) -> str | None:
        """Return a user of another team here that may be served while ``held`` may not.

        Cluster with teams only: the pick waits for someone further behind on another
        replica, at its team's level or (a team mate) inside its team. Without teams every
        other user here is ahead of the pick and waits too; with them, another team's pick
        here may be within its own floor, so the slot is not left waiting for a team that
        cannot take it. Looks at the first :data:`UNHELD_LOOKS` teams in fairness order.
        """
        if self._teams is None:
            return None
        held_key = self._teams.level_key(held)
        for user in self._teams.team_picks(UNHELD_LOOKS):
            if self._teams.level_key(user) != held_key and self.may_serve(user):
                return user
        return None

    def members(self, entry: str) -> list[str]:
        """Return the backlogged users behind a team-level ``entry`` (the entry, for a user)."""
        return self._teams.members(entry) if self._teams is not None else [entry]

    def head_of(self, user: str) -> Ticket:
        """Return the ticket ``user`` would dispatch next, without removing it."""
        flow = self._flows[user]
        while flow.heap[0][1] in self._removed:
            self._removed.discard(heapq.heappop(flow.heap)[1])
        return flow.heap[0][2]

    def users(self) -> Iterator[str]:
        """Iterate over users with queued tickets (not on the hot path)."""
        return iter(self._flows)


class ModelQueue:
    """All queued tickets of one model, one :class:`TierQueue` per configured tier.

    Args:
        num_tiers: how many tiers.
        fairness: makes each tier's fairness policy; given the tier's counters if
            ``counters`` is set, else called without arguments.
        ordering: the ordering policy.
        counters: makes each tier's service counters (None: the policy keeps its own).

    """

    def __init__(
        self,
        num_tiers: int,
        fairness: Callable[..., FairnessPolicy],
        ordering: OrderingPolicy,
        counters: Callable[[], LocalCounters] | None = None,
    ) -> None:
        self.tiers = [self._tier(fairness, ordering, counters) for _ in range(num_tiers)]
        self._per_user: dict[str, int] = {}
        self._len = 0

    @staticmethod
    def _tier(
        fairness: Callable[..., FairnessPolicy],
        ordering: OrderingPolicy,
        counters: Callable[[], LocalCounters] | None,
    ) -> TierQueue:
        if counters is None:
            return TierQueue(fairness(), ordering)
        tier_counters = counters()
        return TierQueue(fairness(tier_counters), ordering, tier_counters)

    def __len__(self) -> int:
        return self._len

    def user_len(self, user: str) -> int:
        """Return how many tickets ``user`` has queued in any tier."""
        return self._per_user.get(user, 0)

    def push(self, ticket: Ticket, *, front: bool = False, resume: bool = False) -> int:
        """Queue ``ticket`` and return an estimate of how many tickets are ahead of it.

        ``resume``: see :meth:`TierQueue.push`.

        The estimate is O(1): everything in higher tiers, plus, inside the ticket's tier, one
        ticket of each other backlogged user for every ticket the user already has queued
        (a round of the round-robin), capped by the tier's length.
        """
        tier = self.tiers[ticket.tier]
        own_ahead = tier.user_len(ticket.user)
        if front:
            tier.push_front(ticket)
        else:
            tier.push(ticket, resume=resume)
        ticket.state = TicketState.QUEUED
        self._len += 1
        self._per_user[ticket.user] = self._per_user.get(ticket.user, 0) + 1
        higher = sum(len(t) for t in self.tiers[: ticket.tier])
        if front:
            return higher
        others = len(tier) - 1 - own_ahead
        rounds = own_ahead + 1
        return higher + own_ahead + min(others, rounds * (tier.active_users - 1))

    def remove(self, ticket: Ticket, *, start: bool = False) -> None:
        """Remove a queued ticket (``start``: to run it now; see :meth:`TierQueue.remove`)."""
        self.tiers[ticket.tier].remove(ticket, start=start)
        self._forget(ticket)

    def pop(self, tier: int, user: str | None = None, *, start: bool = True) -> Ticket:
        """Remove and return the next ticket of ``tier`` (of ``user``, if given).

        ``start``: see :meth:`TierQueue.pop`.
        """
        ticket = self.tiers[tier].pop(user, start=start)
        self._forget(ticket)
        return ticket

    def _forget(self, ticket: Ticket) -> None:
        self._len -= 1
        left = self._per_user[ticket.user] - 1
        if left:
            self._per_user[ticket.user] = left
        else:
            del self._per_user[ticket.user]

    def first_tier(self) -> int | None:
        """Return the index of the highest non-empty tier, or None if all are empty."""
        for i, tier in enumerate(self.tiers):
            if len(tier):
                return i
        return None
