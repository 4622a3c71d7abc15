"""Load and soak: fairq as a child process under thousands of streams, measured from outside.

Run ``python -m fairq_bench.load [--quick]``. The simulator and fairq run as child
processes (``fairq sim``, ``fairq serve``), the load generator is this process, and a fourth
process probes fairq's event loop. Nothing is added to the server: every figure is read from
outside, from ``/proc/<pid>/status``, fairq's own ``/metrics`` and the gRPC responses.

Phases:

1. **Capacity**: ``streams`` requests run at once on the backend (fairq caps the backend at that
   many in flight) while ``queued`` more from ``users`` users wait in fairq's queue. fairq's
   resident memory is read before and after the queue fills (bytes per queued request), and a
   separate prober times a gRPC health ``Check`` every 20 ms: the slowest answer bounds the
   longest event-loop stall of fairq. Every request must end with exactly one terminal event:
   a ``finished`` event and a clean end of stream, or an error status (never both, never
   neither).
2. **Soak**: for a bounded time, open-loop traffic mixed with faults: the backend killed and
   restarted (``SIGKILL``, same port), restarts with an error rate, clients cancelling mid
   stream and requests with short deadlines. At the end fairq must be back to baseline: no
   request in its queue, nothing in flight on any backend, and resident memory within a
   bound of where it was after a warm-up round.

Modules: :mod:`.sizes` (run sizes), :mod:`.children` (child processes), :mod:`.metrics`
(scraping ``/metrics``), :mod:`.prober` (the event-loop prober), :mod:`.driver` (one request
and the tally), :mod:`.capacity` and :mod:`.soak` (the phases), :mod:`.tables` (the report)
and :mod:`.cli` (the command line).
"""

from __future__ import annotations

from fairq_bench.load.capacity import CapacityResult, capacity
from fairq_bench.load.children import (
    ChildProcess,
    free_port,
    process_group_alive,
    start_child,
    start_fairq,
    start_sim,
)
from fairq_bench.load.cli import main
from fairq_bench.load.prober import Prober
from fairq_bench.load.sizes import FULL, QUICK, LoadSize
from fairq_bench.load.soak import SoakResult, soak

__all__ = [
    "FULL",
    "QUICK",
    "CapacityResult",
    "ChildProcess",
    "LoadSize",
    "Prober",
    "SoakResult",
    "capacity",
    "free_port",
    "main",
    "process_group_alive",
    "soak",
    "start_child",
    "start_fairq",
    "start_sim",
]
