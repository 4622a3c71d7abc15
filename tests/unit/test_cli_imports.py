"""The CLI loads per subcommand: help, a file key and a health check import none of the service.

``fairq --help`` took 2.2 s on a quiet machine (5-7 s on a busy one) because the command
imported the whole service (SQLAlchemy, gRPC, both doors) before reading its arguments. A
time bound would be flaky on a loaded machine; which modules a run imported is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Each run in a fresh interpreter: what main() imported, written where the test reads it.
_PROBE = """
import json, sys
from fairq_server.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
with open(sys.argv[2], "w") as f:
    json.dump(sorted(sys.modules), f)
"""

# What the service needs and a quick command does not (the store is SQLAlchemy; its settings,
# part of the configuration's dataclasses, are light).
_SERVICE = (
    "sqlalchemy", "aiohttp", "jwt", "redis", "prometheus_client", "fairq_server.app",
    "fairq_server.core", "fairq_server.doors.http", "fairq_server.doors.grpc",
    "fairq_server.scheduling", "fairq_server.config.loader", "fairq_server.identity.auth",
)  # fmt: skip


def imported(tmp_path: Path, *argv: str) -> set[str]:
    out = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(argv)), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return set(json.loads(out.read_text()))


def heavy(modules: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == b or m.startswith(f"{b}.") for b in banned))


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("keys", "--help"),
        ("keys", "create", "--file", "--user", "alice", "--team", "red"),
        ("keys", "new", "--user", "alice"),
        ("serve", "--help"),
    ],
)
def test_help_and_file_keys_import_none_of_the_service_nor_grpc(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    modules = imported(tmp_path, *argv)
    assert "fairq_server.cli" in modules  # the probe ran the command
    assert heavy(modules, (*_SERVICE, "grpc")) == []


@pytest.mark.parametrize(
    "argv",
    [
        ("health", "--target", "127.0.0.1:1", "--timeout", "0.1"),
        ("teams", "--help"),
        ("keys", "list", "--help"),
    ],
)
def test_tools_that_call_fairq_import_grpc_and_nothing_of_the_service(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    modules = imported(tmp_path, *argv)
    assert "grpc" in modules
    assert heavy(modules, _SERVICE) == []
    if argv[0] == "health":  # a probe every few seconds: not even protobuf
        assert heavy(modules, ("google.protobuf", "grpc_health.v1")) == []


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`fairq keys create --file | head -1`: the write meets a closed pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fairq_server", "keys", "create", "--file", "--user", "a"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 1
    assert b"Traceback" not in done.stderr and b"BrokenPipeError" not in done.stderr
