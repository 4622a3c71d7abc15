"""``fairq teams set / delete / list``: team weights kept in fairq's store, over the Admin API.

A weight set here overrides the configuration file's ``[[teams]]`` entry of the same name and
holds on every replica sharing the store within a poll, without a reload; ``delete`` brings
the file's entry back (if it has one). Every change is in the audit log (``fairq audit``).
"""

from __future__ import annotations

import argparse
import json

from fairq.v1 import admin_pb2
from fairq_server.names import escape
from fairq_server.tools.admin_call import add_target_arguments, admin_stub, call

__all__ = ["main", "source_name"]

_PROG = "fairq teams"


def source_name(source: int) -> str:
    """Return ``file`` or ``store`` for an ``EntrySource``."""
    return "store" if source == admin_pb2.ENTRY_SOURCE_STORE else "file"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Team weights kept in fairq's store. A weight set here overrides the "
        "configuration file's [[teams]] entry of the same name on every replica, without a "
        "reload; delete brings the file's entry back. Every change is in the audit log "
        "(fairq audit).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    setting = sub.add_parser("set", help="set a team's weight on every replica")
    setting.add_argument("name", help="the team, as keys and tokens name it")
    setting.add_argument("weight", type=float, help="above 0; 2 is owed twice a team of 1")
    delete = sub.add_parser("delete", help="remove a stored weight (the file's holds again)")
    delete.add_argument("name")
    listing = sub.add_parser("list", help="the teams in force, with where each comes from")
    for p in (setting, delete, listing):
        add_target_arguments(p)
        p.add_argument("--json", action="store_true", help="JSON output, for scripts")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq teams set|delete|list``."""
    args = _parser().parse_args(argv)
    with admin_stub(args) as (stub, metadata):
        kw = {"metadata": metadata, "timeout": args.timeout}
        if args.action == "set":
            team = admin_pb2.Team(name=args.name, weight=args.weight)
            made = call(
                _PROG, args.target, lambda: stub.SetTeam(admin_pb2.SetTeamRequest(team=team), **kw)
            )
            if made is None:
                return 1
            rows = [made.team]
        elif args.action == "delete":
            request = admin_pb2.DeleteTeamRequest(name=args.name)
            if call(_PROG, args.target, lambda: stub.DeleteTeam(request, **kw)) is None:
                return 1
            print(
                json.dumps({"deleted": args.name})
                if args.json
                else f"deleted {escape(args.name, 200)}"
            )
            return 0
        else:
            listed = call(
                _PROG, args.target, lambda: stub.ListTeams(admin_pb2.ListTeamsRequest(), **kw)
            )
            if listed is None:
                return 1
            rows = list(listed.teams)
    if args.json:
        for t in rows:
            print(json.dumps({"name": t.name, "weight": t.weight, "source": source_name(t.source)}))
        return 0
    print(f"{'TEAM':<32} {'WEIGHT':>8}  SOURCE")
    for t in rows:
        print(f"{escape(t.name, 32):<32} {t.weight:>8g}  {source_name(t.source)}")
    return 0
