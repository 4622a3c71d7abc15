"""How long fast streams are coalesced: longer while fairq's event loop is near its capacity.

Every message towards a caller and every read of a backend costs about the same whatever it
carries, and in the gRPC door the message is most of a token's cost (grpcio's own per-message
machinery, docs/design/hot-path.md). Streams are therefore relayed at most once per
``stream_coalesce_seconds`` (the outbox, the stream reader). At low load a short window keeps
streaming smooth; when the loop is near its capacity every message is late anyway, and a short
window only spends the loop's time on more, smaller messages. So the window *stretches* with
the loop's load: the configured window up to half load, then linearly longer, up to
:data:`MAX_STRETCH` times at :data:`FULL`. The first token of a stream is never held.

The load is measured by :class:`~fairq_server.runtime.loop_monitor.LoopMonitor` every
:data:`SAMPLE_TICKS` of its ticks: the larger of the time the loop thread ran or waited for a
core over the wall time (what the loop spends, or would, on a core of its own) and the share
of ticks at which bulk work was waiting for a later pass of the loop
(:mod:`~fairq_server.runtime.loop_share`; what catches a loop whose core is shared, where
CPU time understates how full it is). Coalescing less cheaply lowers the load, which
shortens the window again: the stretch settles where the load stays below capacity.
"""

from __future__ import annotations

__all__ = ["FULL", "HALF", "MAX_STRETCH", "SAMPLE_TICKS", "Pace"]

#: The longest window, in multiples of the configured one (20 ms -> 100 ms: still a steady
#: flow to a reader, and five times fewer messages).
MAX_STRETCH = 5.0
#: Load (0-1) up to which the configured window holds.
HALF = 0.5
#: Load at which the window is stretched to its longest.
FULL = 0.9
#: Loop-monitor ticks per load sample (10 ms each: a sample per 100 ms).
SAMPLE_TICKS = 10
# Weight of the newest sample: the stretch follows a change of load within a few samples
# without jumping on one noisy one.
_SMOOTHING = 0.5


class Pace:
    """The stretch of the coalescing window on one loop (1.0: as configured).

    One per loop, made at assembly: the loop monitor writes it, the outboxes and stream
    readers of that loop read :attr:`stretch`. A fresh one (never written) keeps the window
    as configured.
    """

    def __init__(self) -> None:
        self.stretch = 1.0
        self.load = 0.0  # smoothed

    def observe(self, load: float) -> None:
        """Take a load sample (0: idle, 1: the loop never rested) and set the stretch."""
        self.load += _SMOOTHING * (min(max(load, 0.0), 1.0) - self.load)
        above = (self.load - HALF) / (FULL - HALF)
        self.stretch = 1.0 + (MAX_STRETCH - 1.0) * min(max(above, 0.0), 1.0)

    def reset(self) -> None:
        """Back to the configured window (the loop is no longer measured)."""
        self.stretch, self.load = 1.0, 0.0
