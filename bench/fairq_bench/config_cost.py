"""What reading the configuration costs: import, first parse, and a reload's parse.

Run ``uv run python -m fairq_bench.config_cost [FILE]`` (default ``examples/fairq.toml``).
With msgspec importable (``PYTHONPATH=/path/to/msgspec``), the same file is also converted
into the same classes by ``msgspec.convert``, for comparison. Figures are medians over fresh
interpreters (start-up) and over repeated parses in one interpreter (reload); see
``docs/design/config.md``.
"""

from __future__ import annotations

import importlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

_STARTUP = r"""
import json, sys, time, tomllib
t0 = time.perf_counter()
import {module}
t1 = time.perf_counter()
{first}
t2 = time.perf_counter()
print(json.dumps({{"import_ms": (t1 - t0) * 1e3, "first_parse_ms": (t2 - t1) * 1e3}}))
"""

_CASES = {
    "fairq loader": (
        "fairq_server.config.loader",
        "fairq_server.config.loader.load_config(sys.argv[1])",
    ),
    "pydantic alone": ("pydantic", "pass"),
    "msgspec alone": ("msgspec", "pass"),
    "msgspec into the config classes": (
        "msgspec, fairq_server.config.schema",
        "msgspec.convert(tomllib.load(open(sys.argv[1], 'rb')), fairq_server.config.schema.Config)",
    ),
}


def _fresh(module: str, first: str, path: str, runs: int) -> dict[str, float] | None:
    code = _STARTUP.format(module=module, first=first)
    samples = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", code, path], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            return None  # not installed
        samples.append(json.loads(done.stdout))
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def _reload_ms(path: str, runs: int) -> dict[str, float]:
    import tomllib

    from fairq_server.config.loader import load_config

    out = {}
    load_config(path)
    start = time.perf_counter()
    for _ in range(runs):
        load_config(path)
    out["fairq load_config"] = (time.perf_counter() - start) / runs * 1e3
    from fairq_server.config.schema import Config

    try:
        msgspec = importlib.import_module("msgspec")  # optional: for comparison only
    except ImportError:
        return out
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    msgspec.convert(raw, Config)
    start = time.perf_counter()
    for _ in range(runs):
        with open(path, "rb") as f:
            msgspec.convert(tomllib.load(f), Config)
    out["msgspec convert (no cross-checks)"] = (time.perf_counter() - start) / runs * 1e3
    return out


def main() -> None:
    """Print the figures as a table."""
    path = sys.argv[1] if len(sys.argv) > 1 else str(Path("examples/fairq.toml"))
    print(f"start-up (median of 7 fresh interpreters), {path}:")
    for name, (module, first) in _CASES.items():
        got = _fresh(module, first, path, 7)
        if got is None:
            print(f"  {name:34} not importable")
            continue
        print(
            f"  {name:34} import {got['import_ms']:7.1f} ms   first parse "
            f"{got['first_parse_ms']:7.2f} ms"
        )
    print("reload (mean of 200 parses in one interpreter):")
    for name, ms in _reload_ms(path, 200).items():
        print(f"  {name:34} {ms:7.3f} ms")


if __name__ == "__main__":
    main()
