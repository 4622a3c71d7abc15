"""The no-lift vtc baseline of the on/off scenario is plain configuration.

``[scheduler] fairness = "vtc"`` with ``[scheduler.fairness_options] lift = false`` keeps a
returning user's old counter (0 for a new one) instead of lifting it, so idle time is banked
as credit: the baseline that shows what the lift prevents. Never use it outside a benchmark.
"""

from __future__ import annotations

__all__ = ["NO_LIFT_OPTIONS"]

NO_LIFT_OPTIONS = {"lift": False}
