"""``python -m fairq_server.bench.scenarios.nolift serve ...``: fairq with a no-lift baseline.

Registers ``vtc-no-lift``, a deliberately broken vtc in which a user's counter is never
lifted when it becomes active again (and never forgotten while idle), then runs the normal
``fairq`` command line. It exists only so the on/off scenario can show what the lift
prevents: a user returning from idle with a counter far below everyone else's takes the
whole backend until it has caught up. Never use it outside the benchmark.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import cast

from fairq_server.scheduling import registry
from fairq_server.scheduling.fairness import VtcFairness, _UserState
from fairq_server.scheduling.interfaces import FairnessPolicy

__all__ = ["NoLiftVtcFairness", "main"]


class NoLiftVtcFairness(VtcFairness):
    """vtc without the lift: idle time is banked as credit (the baseline the lift fixes)."""

    def activate(self, user: str, weight: float) -> None:
        """Mark ``user`` backlogged, keeping whatever counter it had (0 for a new user)."""
        state = self._users.get(user)
        if state is None:
            state = self._users[user] = _UserState()
        if state.active:
            return
        state.weight = weight if weight > 0 else 1.0
        state.active = True
        self._active += 1
        self._push(user, state)

    def deactivate(self, user: str) -> None:
        """Mark ``user`` idle but keep its record (and so its low counter)."""
        state = self._users.get(user)
        if state is None or not state.active:
            return
        state.active = False
        self._active -= 1


def main() -> int:
    """Register ``vtc-no-lift`` and run the fairq command line."""
    policies = cast(dict[str, Callable[[], FairnessPolicy]], registry.FAIRNESS_POLICIES)
    policies["vtc-no-lift"] = NoLiftVtcFairness
    from fairq_server.cli import main as fairq_main

    return fairq_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
