"""Benchmark scenarios beyond the flood: one module each, registered in :data:`SCENARIOS`.

Each scenario is ``async (args, backend_url, out_dir) -> bool``: it runs its comparison,
writes ``<out_dir>/<name>.md`` and plots, and returns True when the result points the right
way (fairq better than FIFO where it must be). Scenarios that need the simulator start their
own, sized for the experiment, and ignore ``backend_url``.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path

from fairq_server.bench.scenarios.overload import overload

__all__ = ["SCENARIOS", "TITLES"]

Scenario = Callable[[argparse.Namespace, str, Path], Awaitable[bool]]

SCENARIOS: dict[str, Scenario] = {
    "overload": overload,
}

TITLES: dict[str, str] = {
    "overload": "2. Backlogged overload (FIFO vs round-robin vs vtc)",
}
