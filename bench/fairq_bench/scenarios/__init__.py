"""Benchmark scenarios beyond the flood: one module each, registered in :data:`SCENARIOS`.

Each scenario is ``async (args, backend_url, out_dir) -> bool``: it runs its comparison,
writes ``<out_dir>/<name>.md`` and plots, and returns True when the result points the right
way (fairq better than FIFO where it must be). Scenarios that need the simulator start their
own, sized for the experiment, and ignore ``backend_url``; ``overhead`` also runs against a
real backend.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path

# Modules, not their functions: a function bound under its module's name would shadow it.
from fairq_bench.scenarios import (
    backpressure,
    console_cost,
    http_overhead,
    ledger,
    onoff,
    overhead,
    overload,
    preemption,
    prefix,
    priority,
    quota_cost,
    quota_replicas,
    short_long,
    soft_quota,
    teams,
)

__all__ = ["SCENARIOS", "TITLES"]

Scenario = Callable[[argparse.Namespace, str, Path], Awaitable[bool]]

SCENARIOS: dict[str, Scenario] = {
    "overload": overload.overload,
    "short-long": short_long.short_long,
    "priority": priority.priority,
    "backpressure": backpressure.backpressure,
    "prefix": prefix.prefix,
    "on-off": onoff.on_off,
    "overhead": overhead.overhead,
    "http-overhead": http_overhead.http_overhead,
    "ledger": ledger.ledger,
    "preemption": preemption.preemption,
    "teams": teams.teams,
    "console-cost": console_cost.console_cost,
    "quota-replicas": quota_replicas.quota_replicas,
    "soft-quota": soft_quota.soft_quota,
    "quota-cost": quota_cost.quota_cost,
}

TITLES: dict[str, str] = {
    "overload": "2. Backlogged overload (FIFO vs round-robin vs vtc)",
    "short-long": "3. Short vs long requests (round-robin vs vtc, weights)",
    "priority": "4. Priority isolation (interactive vs batch flood, aging)",
    "backpressure": "5. Backpressure sweep (waiting threshold x TPOT limit)",
    "prefix": "6. Prefix locality vs fairness (quantum Q)",
    "on-off": "7. On/off user (vtc lift vs no-lift baseline)",
    "overhead": "8. Gateway overhead (added TTFT, tokens/s through one process)",
    "http-overhead": "9. HTTP door overhead (added TTFT, tokens/s, beside the gRPC door)",
    "ledger": "10. Usage ledger (a replica killed, PostgreSQL restarted, SIGTERM)",
    "preemption": "11. Preemption by continuation (light user under several power users)",
    "teams": "13. Teams (weights 2:1, hierarchical vtc, one replica and three)",
    "console-cost": "14. The console's own cost (tokens per core with a page open)",
    "quota-replicas": "15. Quotas across replicas (hard TPM from three replicas, shared vs not)",
    "soft-quota": "16. Soft quotas (the idle-only band: alone, behind in-quota users, cost)",
    "quota-cost": "17. The cost of quota and budget checks (paired TTFT, CPU per request)",
}
