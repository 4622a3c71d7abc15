"""``fairq top``: a live terminal view of fairq's queues, users and backends.

Fed by ``Admin/GetQueueSnapshot`` (an admin key is needed unless fairq runs without keys).
On a terminal the screen is redrawn every ``--interval`` seconds until Ctrl-C; otherwise, or
with ``--once``, one frame is printed. ``--json`` prints the snapshot itself, for scripts.

The view is a few fixed-width tables, drawn with plain ANSI escapes: a terminal-UI library
would add its dependencies to the server's image for about a hundred lines of formatting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import grpc

import fairq

__all__ = ["main", "render"]

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase screen


def _table(headers: list[str], rows: list[list[str]], width: int) -> list[str]:
    """Left-align the first column, right-align the rest; cut lines at ``width``."""
    cols = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(cols[0])
        rest = "  ".join(c.rjust(w) for c, w in zip(cells[1:], cols[1:], strict=True))
        return (first + "  " + rest).rstrip()[:width]

    return [line(headers), *(line(r) for r in rows)]


def _short(text: str, n: int = 24) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def render(snap: fairq.Snapshot, target: str, width: int = 120) -> list[str]:
    """Return the lines of one frame for ``snap``."""
    stamp = time.strftime("%H:%M:%S", time.gmtime(snap.taken_at))
    queued = sum(m.queued for m in snap.models)
    out = [f"fairq top  {target}  {stamp} UTC  queued {queued}  users {snap.known_users}"[:width]]
    tiers = [name for name, _ in snap.models[0].tiers] if snap.models else []
    out.append("")
    if snap.models:
        rows = [
            [_short(m.model), str(m.queued), *(str(n) for _, n in m.tiers), str(m.queued_users)]
            for m in snap.models
        ]
        out += _table(["MODEL", "QUEUED", *tiers, "USERS"], rows, width)
    else:
        out.append("no models (no backend registered)")
    out.append("")
    if snap.users:
        rows = [[_short(u.user), str(u.queued), f"{u.recent_tokens:.0f}"] for u in snap.users]
        out += _table(["USER", "QUEUED", "TOKENS/~1m"], rows, width)
    else:
        out.append("no users queued or served in the last minutes")
    out.append("")
    if snap.backends:
        rows = []
        for b in snap.backends:
            s = b.status
            health = "draining" if s.draining else ("ok" if s.healthy else "UNHEALTHY")
            gates = " ".join(state for _, state in b.gates)
            rows.append([
                _short(s.backend.id), health, str(s.in_flight), f"{s.waiting:g}",
                f"{s.running:g}", f"{s.tpot_seconds * 1000:.0f}", gates,
            ])  # fmt: skip
        out += _table(
            ["BACKEND", "HEALTH", "IN FLIGHT", "WAITING", "RUNNING", "TPOT ms",
             f"GATE ({'/'.join(tiers) or 'per tier'})"],
            rows, width,
        )  # fmt: skip
    else:
        out.append("no backends")
    return [line[:width] for line in out]


def _client(args: argparse.Namespace) -> fairq.Client:
    credentials = None
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    api_key = args.api_key or os.environ.get("FAIRQ_API_KEY") or None
    return fairq.Client(args.target, api_key=api_key, user=args.as_user, credentials=credentials)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairq top",
        description="A live view of fairq's queues, users and backends (an admin key is "
        "needed unless fairq runs without keys). On a terminal the screen is redrawn every "
        "--interval seconds until Ctrl-C; otherwise, or with --once, one frame is printed; "
        "--json prints the snapshot, for scripts.",
    )
    parser.add_argument("--target", default="127.0.0.1:50051", help="host:port of fairq")
    parser.add_argument("--api-key", help="an admin key (default: $FAIRQ_API_KEY)")
    # --as-user, as every other tool that calls fairq spells it (--user: the older one).
    parser.add_argument(
        "--as-user", "--user", dest="as_user", help="x-fairq-user name, for a fairq without keys"
    )
    parser.add_argument("--tls-ca", help="CA certificate (PEM) when fairq serves TLS")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    parser.add_argument("--users", type=int, default=10, help="top users to show")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq top``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.interval > 0 or args.users < 1:
        parser.error("--interval must be above 0 and --users at least 1")
    live = sys.stdout.isatty() and not (args.once or args.json)
    with _client(args) as client:
        try:
            while True:
                try:
                    snap = client.queue_snapshot(top_users=args.users, timeout=5.0)
                except fairq.FairqError as exc:
                    print(f"fairq top: {exc}", file=sys.stderr)
                    return 1
                if args.json:
                    print(json.dumps(dataclasses.asdict(snap)))
                    return 0
                width = os.get_terminal_size().columns if live else 200
                frame = "\n".join(render(snap, args.target, width))
                if not live:
                    print(frame)
                    return 0
                sys.stdout.write(_CLEAR + frame + "\n")
                sys.stdout.flush()
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0
