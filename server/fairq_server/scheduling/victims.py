"""Which running request to preempt for a waiting one, and how often a backend may preempt.

Pure rules over plain values, so they are tested alone (``docs/design/preemption.md``):

- A victim is of a lower tier than the waiting request, or of the same tier with a user
  further above its fair share: in running requests per unit of weight, at least one request
  more than the waiting user would hold after the swap (so the swap never reverses: no
  ping-pong between two users).
- Among those: lowest tier first, then the user furthest above its share, then the request
  preempted least often, then the one with the fewest tokens left by its ``max_tokens``
  (its slot frees soonest; requests with no bound after those with one), then the one that
  has generated most, then the latest arrival.
- Anti-thrash: never within a request's first ``min_tokens`` tokens, at most
  ``max_per_request`` preemptions per request, at most ``max_per_second`` per backend.
- Not for a user who already runs a request on the backend while another running request
  there has ``min_tokens`` or fewer left: that slot frees about as soon as a preemption's
  hand-over would, and at no cost (a user with nothing running preempts at once).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from fairq_server.config.preempt import PreemptConfig

__all__ = ["RateCap", "Running", "Waiting", "choose_victim", "eligible", "rank", "slot_frees_soon"]


@dataclass(frozen=True)
class Waiting:
    """The request that should run now.

    Attributes:
        tier: its tier index (0 is served first).
        standing: its user's running requests on the backend per unit of weight.
        step: what one more running request adds to that standing (1 / weight).

    """

    tier: int
    standing: float
    step: float = 1.0


@dataclass(frozen=True)
class Running:
    """A running request that might be preempted.

    Attributes:
        key: identifies the request to the caller of :func:`choose_victim`.
        tier: its tier index.
        standing: its user's running requests on the backend per unit of weight.
        step: what one request fewer takes from that standing (1 / weight).
        generated: tokens it has generated (over all its attempts).
        remaining: tokens it may still generate (None: no bound known).
        preemptions: how often it was preempted already.
        seq: its arrival order.
        exempt: it may not be preempted at all (``n > 1``, logprobs, a seed, ...).
        carried: of ``generated``, the tokens carried into its current attempt by an earlier
            preemption (0 on a first attempt).

    """

    key: object
    tier: int
    standing: float
    step: float
    generated: int
    remaining: int | None
    preemptions: int
    seq: int
    exempt: bool = False
    carried: int = 0


def eligible(victim: Running, waiting: Waiting, cfg: PreemptConfig) -> bool:
    """Whether ``victim`` may be preempted for ``waiting`` at all."""
    if victim.exempt or victim.preemptions >= cfg.max_per_request:
        return False
    if victim.generated - victim.carried < cfg.min_tokens:
        # Counted in the current attempt: a resumed request has just paid its prefill again.
        return False
    if _about_to_finish(victim, cfg):
        return False  # waiting for it is cheaper than redoing it
    if victim.tier != waiting.tier:
        return victim.tier > waiting.tier
    return victim.standing - victim.step >= waiting.standing + waiting.step


def choose_victim(
    waiting: Waiting, running: Iterable[Running], cfg: PreemptConfig
) -> Running | None:
    """Return the running request to preempt for ``waiting`` (None: none may be)."""
    best: Running | None = None
    for victim in running:
        if not eligible(victim, waiting, cfg):
            continue
        if best is None or rank(victim) < rank(best):
            best = victim
    return best


def rank(r: Running) -> tuple[int, float, int, float, int, int]:
    """Return the sort key of a victim, best first (see the module's rules)."""
    # Fewest tokens left: the preempting request's run delays the victim's slot by that run
    # and two hand-overs, and a slot that a light run already put behind holds the request
    # that started latest, which "generated least" would pick again: one slot then carries
    # every light run and ends the flood. The slot that frees soonest is the one furthest
    # ahead, where a direct engine's queue would put the light request too. With a prefix
    # cache the victim's longer output costs little to re-read (docs/design/preemption.md,
    # "The victim"). Preempted least before that: a request is paused at most once while
    # an untouched one may be.
    left = math.inf if r.remaining is None else r.remaining
    return (-r.tier, -r.standing, r.preemptions, left, -r.generated, -r.seq)


def slot_frees_soon(running: Iterable[Running], cfg: PreemptConfig) -> bool:
    """Whether a request in ``running`` has ``min_tokens`` or fewer left (a slot frees soon).

    Waiting for it costs the waiting request at most ``min_tokens`` engine steps; preempting
    costs a hand-over and a prefill, and pushes the victim's rest into the flood's tail. The
    bound is ``max_tokens``: a request may end sooner, never later.
    """
    return any(_about_to_finish(r, cfg) for r in running)


def _about_to_finish(r: Running, cfg: PreemptConfig) -> bool:
    """Whether ``r`` has ``min_tokens`` or fewer tokens left by its ``max_tokens``."""
    return r.remaining is not None and r.remaining <= cfg.min_tokens


class RateCap:
    """At most ``per_second`` events in any one-second window (per backend)."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self._times: deque[float] = deque()

    def allows(self, now: float) -> bool:
        """Whether one more event may happen at ``now``."""
        while self._times and self._times[0] <= now - 1.0:
            self._times.popleft()
        return len(self._times) < self.per_second

    def record(self, now: float) -> None:
        """Count an event at ``now``."""
        self._times.append(now)
