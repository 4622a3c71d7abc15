"""The benchmarks' CPU clock for a child process: the scheduler's run time, not 10 ms ticks."""

from __future__ import annotations

import os
import subprocess
import sys

from fairq_bench.processes import cpu_seconds, run_seconds

# Spins for the given CPU time (its own clock), then waits to be read and killed.
_SPIN = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass\n"
    "print('done', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_run_seconds_counts_a_child_s_cpu_finer_than_ticks() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _SPIN, "0.23"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "done\n"
        exact, ticks = run_seconds(child.pid), cpu_seconds(child.pid)
    finally:
        child.kill()
        child.wait()
    # The child burned 0.23 s of its own CPU after starting the interpreter (tens of ms).
    assert 0.23 <= exact < 0.23 + 0.5
    assert abs(exact - ticks) < 0.05  # the same clock, read at two resolutions
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert round(exact / tick) * tick != exact  # not whole ticks: the fine clock was read
