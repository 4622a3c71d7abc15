"""``fairq keys create / list / revoke / rotate``: keys kept in fairq's store, over the Admin API.

Unlike ``fairq keys create --file`` (a key for the configuration file), these keys live in the store
that every replica reads: made, revoked and rotated without editing a file or reloading. The
key is printed once, at creation or rotation; the store keeps only its SHA-256 digest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from fairq.v1 import admin_pb2
from fairq_server.names import escape
from fairq_server.tools.admin_call import add_target_arguments, admin_stub, call

__all__ = ["ACTIONS", "main"]

ACTIONS = ("create", "list", "revoke", "rotate")
_PROG = "fairq keys"


def _duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``15m``, ``90s`` or a plain number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    text = text.strip().lower()
    try:
        scale = 1
        if text and text[-1] in units:
            text, scale = text[:-1], units[text[-1]]
        value = float(text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30d, 12h)") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}")
    return value


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)) if seconds else "-"


def _as_dict(key: admin_pb2.StoredKey) -> dict[str, Any]:
    return {
        "id": key.id, "user": key.user, "team": key.team or None, "tiers": list(key.tiers),
        "admin": key.admin, "created_at": _when(key.created_at_unix_seconds),
        "expires_at": _when(key.expires_at_unix_seconds) if key.expires_at_unix_seconds else None,
        "revoked_at": _when(key.revoked_at_unix_seconds) if key.revoked_at_unix_seconds else None,
        "replaces": key.replaces or None,
    }  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Keys kept in fairq's store, which every replica reads: made, revoked "
        "and rotated without editing a file or reloading. A key is printed once, at "
        "creation or rotation; the store keeps only its SHA-256 digest.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser(
        "create",
        help="make a stored key; print it once",
        description="Make a key in fairq's store and print it once (fairq keys create --file: "
        "a key for the configuration file instead, see fairq keys create --file --help).",
    )
    create.add_argument("--user", required=True, help="the user the key identifies")
    create.add_argument("--team", default="", help="the team the key's user belongs to")
    create.add_argument(
        "--max-tier",
        metavar="TIER",
        help="the highest tier the key may use, and its default; every lower tier may be "
        "requested too (default: every tier)",
    )
    # The older spelling, comma-separated: the highest tier listed is the ceiling.
    create.add_argument("--tiers", default="", help=argparse.SUPPRESS)
    create.add_argument("--admin", action="store_true", help="may call the Admin service")
    create.add_argument(
        "--expires-in", type=_duration, default=0.0, help="e.g. 90d (default: never)"
    )
    listing = sub.add_parser("list", help="list the stored keys")
    listing.add_argument("--all", action="store_true", help="include revoked keys")
    revoke = sub.add_parser("revoke", help="revoke a stored key on every replica")
    revoke.add_argument("id", help="the key's id (from list)")
    rotate = sub.add_parser("rotate", help="replace a stored key by a new one like it")
    rotate.add_argument("id", help="the key's id (from list)")
    grace = "how long the old key keeps working (default: 0, revoked at once)"
    rotate.add_argument("--grace", type=_duration, default=0.0, help=grace)
    for p in (create, listing, revoke, rotate):
        add_target_arguments(p)
        p.add_argument("--json", action="store_true", help="JSON output, for scripts")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq keys create|list|revoke|rotate``."""
    args = _parser().parse_args(argv)
    with admin_stub(args) as (stub, metadata):
        kw = {"metadata": metadata, "timeout": args.timeout}
        if args.action == "create":
            tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
            if args.max_tier is not None:
                tiers = [args.max_tier.strip()]
            request = admin_pb2.CreateKeyRequest(
                user=args.user, team=args.team, tiers=tiers, admin=args.admin,
                expires_in_seconds=args.expires_in,
            )  # fmt: skip
            made = call(_PROG, args.target, lambda: stub.CreateKey(request, **kw))
            return 1 if made is None else _print_secret(made.key, made.secret, args.json)
        if args.action == "rotate":
            rotate = admin_pb2.RotateKeyRequest(id=args.id, grace_seconds=args.grace)
            rotated = call(_PROG, args.target, lambda: stub.RotateKey(rotate, **kw))
            return 1 if rotated is None else _print_secret(rotated.key, rotated.secret, args.json)
        if args.action == "revoke":
            revoke = admin_pb2.RevokeKeyRequest(id=args.id)
            revoked = call(_PROG, args.target, lambda: stub.RevokeKey(revoke, **kw))
            if revoked is None:
                return 1
            print(json.dumps(_as_dict(revoked.key)) if args.json else f"revoked {revoked.key.id}")
            return 0
        listing = admin_pb2.ListKeysRequest(include_revoked=args.all)
        listed = call(_PROG, args.target, lambda: stub.ListKeys(listing, **kw))
        if listed is None:
            return 1
        _print_list(list(listed.keys), args.json)
        return 0


def _print_secret(key: admin_pb2.StoredKey, secret: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({**_as_dict(key), "key": secret}))
        return 0
    print(f"API key {key.id} for {escape(key.user, 200)} (shown once; the store keeps only its "
          f"SHA-256):\n\n    {secret}\n")  # fmt: skip
    sys.stdout.flush()
    return 0


def _print_list(keys: list[admin_pb2.StoredKey], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_as_dict(k) for k in keys]))
        return
    heads = ("ID", "USER", "TEAM", "TIERS", "ADMIN", "EXPIRES")
    print(f"{heads[0]:<16}  {heads[1]:<20}  {heads[2]:<12}  {heads[3]:<20}  {heads[4]:<5}  "
          f"{heads[5]:<20}  REVOKED")  # fmt: skip
    for k in keys:
        d = _as_dict(k)
        print(
            f"{k.id:<16}  {escape(k.user, 40):<20}  {escape(k.team or '-', 40):<12}  "
            f"{escape(','.join(k.tiers) or '*', 40):<20}  {'yes' if k.admin else 'no':<5}  "
            f"{d['expires_at'] or '-':<20}  {d['revoked_at'] or '-'}"
        )
