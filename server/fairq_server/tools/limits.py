"""``fairq limits set / delete / list``: quotas and budgets kept in fairq's store, over Admin.

An entry set here overrides the configuration file's ``[[quotas]]`` or ``[[budgets]]`` entry
of the same subject (team or user, and model) and holds on every replica sharing the store
within a poll, without a reload; ``delete`` brings the file's entry back (if it has one). It
is checked by the file's rules. Every change is in the audit log (``fairq audit``). Examples::

    fairq limits set quota --user alice --tokens-per-minute 50000 --mode soft
    fairq limits set budget --team research --per-day 20
    fairq limits delete quota --user alice
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fairq.v1 import admin_pb2
from fairq_server.names import escape
from fairq_server.tools.admin_call import add_target_arguments, admin_stub, call
from fairq_server.tools.teams import source_name

_EXAMPLES = """examples:
  fairq limits set quota --user alice --tokens-per-minute 50000 --mode soft
  fairq limits set budget --team research --per-day 20
  fairq limits delete quota --user alice
"""

__all__ = ["main"]

_PROG = "fairq limits"
_KINDS = {"quota": admin_pb2.LIMIT_KIND_QUOTA, "budget": admin_pb2.LIMIT_KIND_BUDGET}
_AMOUNTS = ("tokens_per_minute", "tokens_per_day", "requests_per_minute", "per_day", "per_month")


def _subject(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=sorted(_KINDS))
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--team", default="", help="the team limited (all its users together)")
    who.add_argument("--user", default="", help="the user limited ('*': each user)")
    parser.add_argument("--model", default="", help="this model only (default: all together)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Quotas and budgets kept in fairq's store. An entry set here overrides "
        "the configuration file's [[quotas]] or [[budgets]] entry of the same team or user "
        "and model on every replica, without a reload; delete brings the file's entry back. "
        "Every change is in the audit log (fairq audit).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    setting = sub.add_parser("set", help="set a quota or budget on every replica")
    _subject(setting)
    for name in _AMOUNTS[:3]:
        setting.add_argument(f"--{name.replace('_', '-')}", type=int, default=0, help="quotas")
    for name in _AMOUNTS[3:]:
        setting.add_argument(f"--{name.replace('_', '-')}", type=float, default=0.0, help="budgets")
    setting.add_argument("--mode", choices=("hard", "soft"), default="hard")
    delete = sub.add_parser("delete", help="remove a stored entry (the file's holds again)")
    _subject(delete)
    listing = sub.add_parser("list", help="the quotas and budgets in force")
    for p in (setting, delete, listing):
        add_target_arguments(p)
        p.add_argument("--json", action="store_true", help="JSON output, for scripts")
    return parser


def _as_dict(limit: admin_pb2.Limit) -> dict[str, Any]:
    kind = "quota" if limit.kind == admin_pb2.LIMIT_KIND_QUOTA else "budget"
    found: dict[str, Any] = {"kind": kind, "team": limit.team or None, "user": limit.user or None,
                             "model": limit.model or None}  # fmt: skip
    found |= {n: getattr(limit, n) for n in _AMOUNTS if getattr(limit, n)}
    return found | {"mode": limit.mode, "source": source_name(limit.source)}


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq limits set|delete|list``."""
    args = _parser().parse_args(argv)
    with admin_stub(args) as (stub, metadata):
        kw = {"metadata": metadata, "timeout": args.timeout}
        if args.action == "set":
            limit = admin_pb2.Limit(
                kind=_KINDS[args.kind], team=args.team, user=args.user, model=args.model,
                mode=args.mode, **{n: getattr(args, n) for n in _AMOUNTS},
            )  # fmt: skip
            request = admin_pb2.SetLimitRequest(limit=limit)
            made = call(_PROG, args.target, lambda: stub.SetLimit(request, **kw))
            if made is None:
                return 1
            rows = [made.limit]
        elif args.action == "delete":
            forget = admin_pb2.DeleteLimitRequest(
                kind=_KINDS[args.kind], team=args.team, user=args.user, model=args.model
            )
            if call(_PROG, args.target, lambda: stub.DeleteLimit(forget, **kw)) is None:
                return 1
            print(json.dumps({"deleted": True}) if args.json else "deleted")
            return 0
        else:
            listed = call(
                _PROG, args.target, lambda: stub.ListLimits(admin_pb2.ListLimitsRequest(), **kw)
            )
            if listed is None:
                return 1
            rows = list(listed.limits)
    for row in map(_as_dict, rows):
        if args.json:
            print(json.dumps(row))
            continue
        subject = f"team {row['team']}" if row["team"] else f"user {row['user']}"
        amounts = ", ".join(f"{n}={row[n]:g}" for n in _AMOUNTS if n in row)
        print(f"{row['kind']:<7} {escape(subject, 40):<40} {escape(row['model'] or 'all', 24):<24} "
              f"{amounts}, {row['mode']} ({row['source']})")  # fmt: skip
    return 0
