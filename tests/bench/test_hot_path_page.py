"""The hot-path page: a run recorded as "before" stays when a later run fills "after"."""

from __future__ import annotations

import json
from pathlib import Path

from fairq_bench.hot_path.page import Figures, write_page


def _figures(per_core: float) -> Figures:
    both = {"grpc": per_core, "http": per_core}
    return Figures(
        per_core=both, tokens_per_second=both, fairq_cores={"grpc": 1.0, "http": 1.0},
        direct=(0.001, 0.002), added_p50={"grpc": 0.0004, "http": 0.0003},
        added_p99={"grpc": 0.0009, "http": 0.0008}, loaded_p99={"grpc": 0.0015, "http": 0.001},
        loaded_cores={"grpc": 0.8, "http": 0.8}, loaded_streams={"grpc": 400, "http": 480},
        replica_p50={"grpc": 0.0002, "http": 0.0001}, streams=400, replicas=3,
        load_average=(1.0, 1.5), rounds=(5, 100, 3, 5.0),
    )  # fmt: skip


def _row(page: str, label: str) -> list[str]:
    line = next(x for x in page.splitlines() if x.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_before_is_kept_and_after_filled(tmp_path: Path) -> None:
    write_page(tmp_path, _figures(10_000.0), quick=False, as_before=True, flames=[])
    first = (tmp_path / "hot-path.md").read_text()
    assert _row(first, "gRPC door: tokens per fairq core-second")[2:] == ["10000", "n/a"]

    write_page(tmp_path, _figures(70_000.0), quick=False, as_before=False, flames=[])
    page = (tmp_path / "hot-path.md").read_text()
    assert _row(page, "HTTP door: tokens per fairq core-second")[2:] == ["10000", "70000"]
    assert _row(page, "gRPC door: added TTFT p50, low load (ms)")[2:] == ["0.4", "0.4"]
    stored = json.loads((tmp_path / "hot-path.json").read_text())
    assert stored["before"]["per_core"]["grpc"] == 10_000.0
    assert stored["after"]["per_core"]["grpc"] == 70_000.0
