"""`fairq bench all --backend sim --quick`: every scenario runs and points the right way.

It takes about four minutes on the 2-core reference machine, too long for `make test`, so it
runs only when FAIRQ_BENCH=1 (CI runs it as a separate step):

    FAIRQ_BENCH=1 uv run pytest -q tests/bench/test_bench_quick.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("FAIRQ_BENCH") != "1", reason="slow (~4 min): set FAIRQ_BENCH=1 to run"
)


@pytest.mark.timeout(900)
def test_quick_suite_points_the_right_way(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks"
    proc = subprocess.run(
        [sys.executable, "-m", "fairq_server", "bench", "all", "--backend", "sim", "--quick",
         "--out", str(out)],
        capture_output=True, text=True, timeout=880, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    pages = {p.name for p in out.glob("*.md")}
    expected = {"README.md", "flood-sim.md", "overload.md", "short-long.md", "priority.md",
                "backpressure.md", "prefix.md", "on-off.md", "overhead.md"}  # fmt: skip
    assert expected <= pages
    assert all((out / f"{name[:-3]}.png").exists() for name in expected - {"README.md"})
