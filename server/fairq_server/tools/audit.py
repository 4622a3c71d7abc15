"""``fairq audit``: the changes admins made (keys, backends, teams, limits, console logins).

Newest first, from the store's audit log over the Admin API: when, who, through what
(``admin-api`` or ``console``), the action, its target and detail, and the replica.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from fairq.v1 import admin_pb2
from fairq_server.names import escape
from fairq_server.tools.admin_call import add_target_arguments, admin_stub, call

__all__ = ["main"]

_PROG = "fairq audit"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="The changes admins made (keys, backends, teams, limits, console "
        "logins), newest first: when, who, through what (admin-api or console), the action, "
        "its target and detail, and the replica.",
    )
    parser.add_argument("--action", default="", help="only this action (e.g. limit.set)")
    parser.add_argument("--limit", type=int, default=100, help="rows, newest first (max 1000)")
    add_target_arguments(parser)
    parser.add_argument("--json", action="store_true", help="JSON output, for scripts")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq audit``."""
    args = _parser().parse_args(argv)
    if not 1 <= args.limit <= 1000:
        print(f"{_PROG}: --limit must be 1-1000", file=sys.stderr)
        return 2
    request = admin_pb2.ListAuditLogRequest(limit=args.limit, action=args.action)
    with admin_stub(args) as (stub, metadata):
        kw = {"metadata": metadata, "timeout": args.timeout}
        found = call(_PROG, args.target, lambda: stub.ListAuditLog(request, **kw))
    if found is None:
        return 1
    for e in found.entries:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.at_unix_seconds))
        fields = {"at": when, "actor": e.actor, "via": e.via, "action": e.action,
                  "target": e.target, "detail": e.detail, "replica": e.replica}  # fmt: skip
        if args.json:
            print(json.dumps(fields))
        else:
            print("  ".join(escape(str(v), 120) for v in fields.values()))
    return 0
