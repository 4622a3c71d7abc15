"""``fairq usage``: the usage ledger summed by team, user or model, over the Admin API.

Examples::

    fairq usage --by team --since 7d
    fairq usage --by user --since 2026-11-01 --until 2026-12-01 --csv > november.csv

Names are reported verbatim (in CSV, quoted as CSV quotes; in the table, control characters
are escaped). Costs are in the units of the configured ``[prices]``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from datetime import UTC, datetime

from fairq.v1 import admin_pb2
from fairq_server.names import escape
from fairq_server.tools.admin_call import add_target_arguments, admin_stub, call

__all__ = ["main", "parse_since"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """Return the Unix time ``text`` names: ``7d`` / ``12h`` ago, or an ISO date or time (UTC).

    Raises:
        argparse.ArgumentTypeError: neither form.

    """
    text = text.strip()
    if text and text[-1].lower() in _UNITS:
        try:
            amount = float(text[:-1])
        except ValueError:
            amount = -1.0
        if 0 <= amount < 1e6:
            return now - amount * _UNITS[text[-1].lower()]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (e.g. 7d, 12h, 2026-11-01, 2026-11-01T08:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq usage``."""
    parser = argparse.ArgumentParser(
        prog="fairq usage",
        description="The usage ledger summed by team, user or model. Names are reported "
        "verbatim (in CSV quoted as CSV quotes; in the table control characters are escaped); "
        "costs are in the units of the configured [prices].",
        epilog="examples:\n  fairq usage --by team --since 7d\n"
        "  fairq usage --by user --since 2026-11-01 --until 2026-12-01 --csv > november.csv\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--by", choices=("team", "user", "model"), default="team")
    parser.add_argument("--since", default="7d", help="7d, 12h, or an ISO date (default: 7d)")
    parser.add_argument("--until", default="", help="an ISO date or 1d-style age (default: now)")
    parser.add_argument("--csv", action="store_true", help="CSV on standard output")
    add_target_arguments(parser)
    args = parser.parse_args(argv)
    now = time.time()
    try:
        since = parse_since(args.since, now)
        until = parse_since(args.until, now) if args.until else 0.0
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    request = admin_pb2.GetUsageReportRequest(
        by=args.by, since_unix_seconds=max(since, 0.0), until_unix_seconds=max(until, 0.0)
    )
    with admin_stub(args) as (stub, metadata):
        report = call(
            "fairq usage",
            args.target,
            lambda: stub.GetUsageReport(request, metadata=metadata, timeout=args.timeout),
        )
    if report is None:
        return 1
    header = [args.by, "requests", "finished", "input_tokens", "output_tokens", "cost"]
    rows = [
        [
            "" if r.no_team else r.name,
            r.requests,
            r.finished,
            r.input_tokens,
            r.output_tokens,
            round(r.cost, 6),
        ]
        for r in report.rows
    ]
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        return 0
    heads = (header[0].upper(), "REQUESTS", "FINISHED", "INPUT", "OUTPUT", "COST")
    print(
        f"{heads[0]:<24} {heads[1]:>9} {heads[2]:>9} {heads[3]:>12} {heads[4]:>12} {heads[5]:>12}"
    )
    for r, row in zip(report.rows, rows, strict=True):
        name = "(no team)" if r.no_team else escape(r.name, 60)
        print(f"{name:<24} {row[1]:>9} {row[2]:>9} {row[3]:>12} {row[4]:>12} {row[5]:>12.4f}")
    return 0
