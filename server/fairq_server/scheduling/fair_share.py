"""Fair-share backend priority: the tier first, then the user's standing on the backend.

A backend that schedules by priority (vLLM ``--scheduling-policy priority``; SGLang with
priority scheduling, through the ``openai`` kind) orders its own waiting queue by the
``priority`` fairq sends. Sending only the tier leaves requests of one tier in arrival order
there: a light user's request queues behind the backlogged users' requests already waiting in
the backend. With ``fair_share_priority`` on a backend, fairq also encodes, inside the tier,
whether the request's user holds less than a fair share of that backend:

* Each tier priority ``p`` owns the two values ``STRIDE * p`` (boosted) and
  ``STRIDE * p + 1`` (normal), lower first. The ranges of distinct tier priorities never
  overlap, so no boost crosses a tier boundary; adapters of backends that serve higher values
  first negate the value, which keeps both orders.
* A request is *boosted* when, counting it, its user would hold at least ``MARGIN`` requests
  fewer than an equal share of fairq's requests in flight on that backend (running or waiting
  there), and the backend has fewer than ``MAX_BOOSTED`` boosted requests in flight.

The margin keeps users with about equal shares from leapfrogging each other (no boost, no
reordering, among equals); the cap bounds how much boosted work can pass the backlogged users'
waiting requests at once and, on an engine that preempts its lowest-priority running request
when it runs out of KV cache, how many running requests a boost can displace. The rule reads
only the dispatcher's own counts (:class:`BackendState`), so it costs O(1) per dispatch. See
``docs/design/fair-share-priority.md``.
"""

from __future__ import annotations

from fairq_server.scheduling.backend_state import BackendState

__all__ = [
    "MARGIN",
    "MAX_BOOSTED",
    "STRIDE",
    "below_share",
    "enabled",
    "encode",
    "may_boost",
]

#: Backend priority values per tier priority: boosted, then normal.
STRIDE = 2
#: Requests by which a user must stay below an equal share (counting the new request).
MARGIN = 1.0
#: Boosted requests in flight per backend, at most.
MAX_BOOSTED = 2


def encode(tier_priority: int, boosted: bool) -> int:
    """Return the priority to send: ``tier_priority``'s range, boosted or normal (lower first).

    For any integers ``p < q`` every value of ``p`` is below every value of ``q``.
    """
    return tier_priority * STRIDE + (0 if boosted else 1)


def below_share(own: int, in_flight: int, users: int, margin: float = MARGIN) -> bool:
    """Whether one more request of a user keeps it ``margin`` below an equal share.

    Args:
        own: the user's requests in flight on the backend now.
        in_flight: all of fairq's requests in flight there now.
        users: distinct users with requests in flight there, counting this user.
        margin: how many requests below the equal share the user must stay.

    """
    return own + 1 + margin <= (in_flight + 1) / max(users, 1)


def enabled(backend: BackendState) -> bool:
    """Whether ``backend`` gets fair-share priorities (it schedules by priority, and asked)."""
    b = backend.backend
    return b.priority_scheduling and b.fair_share_priority


def may_boost(backend: BackendState, user: str) -> bool:
    """Whether a request of ``user`` dispatched to ``backend`` now is boosted."""
    if not enabled(backend) or backend.boosted_in_flight >= MAX_BOOSTED:
        return False
    own = backend.user_in_flight.get(user, 0)
    users = len(backend.user_in_flight) + (0 if own else 1)
    return below_share(own, backend.in_flight, users)
