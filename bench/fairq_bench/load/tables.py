"""The report: the capacity figures and the soak rounds as markdown tables."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fairq_bench.load.capacity import CapacityResult
from fairq_bench.load.prober import ProbeStats
from fairq_bench.load.soak import SoakResult
from fairq_bench.report import markdown_table

__all__ = ["capacity_table", "soak_table"]


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 1000:.0f} ms"


def _examples(examples: dict[str, str]) -> str:
    return "; ".join(f"{code}: {text[:160]}" for code, text in sorted(examples.items())) or "-"


def _probe(p: ProbeStats) -> str:
    return f"{_ms(p.p50)} / {_ms(p.p99)} / {_ms(p.max)}"


def capacity_table(r: CapacityResult) -> str:
    """The capacity figures as a markdown table."""
    probe = r.probe or ProbeStats()
    fill = r.probe_queue_fill or probe
    codes = ", ".join(f"{k} {v}" for k, v in sorted(r.tally.codes.items()))
    rows: list[Sequence[object]] = [
        ("running streams (fairq in flight, peak)", f"{r.peak_in_flight:.0f}"),
        ("running on the backend (sim, peak)", f"{r.peak_backend_running:.0f}"),
        ("queued in fairq (peak depth)", f"{r.peak_queue_depth:.0f}"),
        ("users", r.size.users),
        ("time to start all streams", f"{r.stream_start_seconds:.1f} s"),
        ("time to queue all requests", f"{r.queue_fill_seconds:.1f} s"),
        (
            "fairq RSS idle / with streams / with queue",
            f"{r.rss_idle / 2**20:.0f} / {r.rss_streams / 2**20:.0f} / "
            f"{r.rss_queued / 2**20:.0f} MiB",
        ),
        ("fairq RSS per running stream", f"{r.bytes_per_stream / 1024:.1f} KiB"),
        ("fairq RSS per queued request", f"{r.bytes_per_queued / 1024:.1f} KiB"),
        ("fairq health probe p50 / p99 / max, whole run", _probe(probe)),
        ("  the same while the queue fills", _probe(fill)),
        (
            "  idle control server at the same instants, p99 / max",
            f"{_ms(probe.control_p99)} / {_ms(probe.control_max)}",
        ),
        (
            "  fairq minus control, p99 / max (stall bound)",
            f"{_ms(probe.excess_p99)} / {_ms(probe.excess_max)}",
        ),
        (
            "fairq's event-loop lag (10 ms timer): late > 50 ms / > 100 ms / > 1 s, of ticks",
            f"{r.lag_over_50ms:.0f} / {r.lag_over_100ms:.0f} / {r.lag_over_1s:.0f} "
            f"of {r.lag_ticks:.0f}",
        ),
        (
            "fairq's garbage-collector passes: full / any over 50 ms",
            f"{r.gc_full_passes:.0f} / {r.gc_passes_over_50ms:.0f}",
        ),
        ("health probes (failed)", f"{probe.count} ({probe.failures})"),
        (
            "  slowest probes (s into the run: latency)",
            ", ".join(f"{at:.0f} s: {_ms(lat)}" for at, lat in probe.worst) or "-",
        ),
        ("  streams ended, first wave of queued work started at", f"{r.first_wave_seconds:.0f} s"),
        (
            "fairq CPU (avg cores)",
            f"{r.fairq_cpu_seconds:.0f} s ({r.fairq_cpu_seconds / max(r.total_seconds, 1e-9):.2f})",
        ),
        ("requests: outcomes", codes),
        ("  first message per error status", _examples(r.tally.examples)),
        ("requests without exactly one terminal event", len(r.tally.violations)),
        ("  e.g.", "; ".join(str(v) for v in r.tally.violations[:2]) or "-"),
        ("requests counted by fairq's fairq_requests_total", f"{r.server_outcomes:.0f}"),
        ("queue and in-flight back to 0 after", "yes" if r.quiet_after else "NO"),
        ("wall time", f"{r.total_seconds:.0f} s"),
    ]
    return markdown_table(("capacity", "value"), rows)


def soak_table(r: SoakResult) -> str:
    """The soak rounds as a markdown table."""
    rows: list[Sequence[object]] = []
    for x in r.rounds:
        codes = ", ".join(f"{k} {v}" for k, v in sorted(x.codes.items()))
        rows.append(
            (
                f"{x.index}: {x.fault} ({x.victim})",
                f"{x.sent} / {x.reached_server} / {x.server_outcomes:.0f}",
                codes,
                " / ".join(str(x.unavailable[k]) for k in ("queued", "before text", "mid-stream")),
                x.repeated_started,
                x.violations,
                f"{x.rss / 2**20:.1f}",
                f"{_ms(x.probe.max)} ({_ms(x.probe.excess_max)})",
            )
        )
    header = (
        "round: fault (backend)",
        "sent / reached fairq / fairq counted",
        "client outcomes",
        "UNAVAILABLE: while queued / before text / mid-stream",
        "retried (2nd started)",
        "not one terminal event",
        "fairq RSS MiB (quiet)",
        "probe max (minus control)",
    )
    lines = [
        markdown_table(header, rows),
        "",
        f"RSS growth first -> last round: {r.rss_growth / 2**20:+.1f} MiB; "
        f"queue and in-flight back to 0 after every round: "
        f"{'yes' if r.quiet_every_round else 'NO'}",
        "",
        *(f"- round {x.index}, first messages: {_examples(x.examples)}" for x in r.rounds),
        f"- finished, then the client's own deadline (see Outcome.deadline_race): "
        f"{sum(x.deadline_races for x in r.rounds)}",
        *(
            f"- round {x.index}, not one terminal event: {v}"
            for x in r.rounds
            for v in x.violation_examples
        ),
    ]
    if r.churn_users:
        lines.append(
            f"User churn: {r.churn_users} requests grew fairq's quiet RSS by "
            f"{r.churn_rss_known / 2**20:+.1f} MiB from 8 known users and by "
            f"{r.churn_rss_delta / 2**20:+.1f} MiB from as many new users "
            f"({(r.churn_rss_delta - r.churn_rss_known) / r.churn_users:+.0f} bytes per new user)"
        )
    return "\n".join(lines)
