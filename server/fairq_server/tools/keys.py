"""``fairq keys new``: make an API key and the ``[[keys]]`` entry that admits it.

The key is printed once and never stored: the configuration holds only its SHA-256 digest.
"""

from __future__ import annotations

import argparse
import json
import sys

from fairq_server.auth import KEY_PREFIX, hash_key, new_key
from fairq_server.config import DEFAULT_TIERS, ConfigError
from fairq_server.config_file import load_config
from fairq_server.identity.settings import MAX_KEY_USER_CHARS

__all__ = ["KEY_PREFIX", "key_entry", "main", "new_key"]

# A recognisable prefix lets secret scanners and people spot a leaked fairq key.
# Keys in fairq's store (fairq_server.tools.stored_keys), rather than in the file.
STORE_ACTIONS = {
    "create": "make a key in the store",
    "list": "list the store's keys",
    "revoke": "revoke a stored key on every replica",
    "rotate": "replace a stored key",
}


def _toml_string(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes, \uXXXX for the rest).
    return json.dumps(value)


def key_entry(
    user: str,
    digest: str,
    *,
    tiers: list[str] | None = None,
    admin: bool = False,
    weight: float | None = None,
    group: str | None = None,
) -> str:
    """Return the TOML ``[[keys]]`` table for a key with SHA-256 ``digest``."""
    lines = ["[[keys]]", f"user = {_toml_string(user)}", f'sha256 = "{digest}"']
    if tiers:
        lines.append(f"tiers = [{', '.join(_toml_string(t) for t in tiers)}]")
    if admin:
        lines.append("admin = true")
    if weight is not None:
        lines.append(f"weight = {weight!r}")
    if group is not None:
        lines.append(f"group = {_toml_string(group)}")
    return "\n".join(lines) + "\n"


def _tier_names(config_path: str | None) -> tuple[tuple[str, ...], str]:
    """Return the tier names a key may name, and a sentence saying which they are."""
    if config_path is None:
        names = tuple(t.name for t in DEFAULT_TIERS)
        return names, (
            f"the default tiers are {', '.join(names)} (--config FILE checks against the "
            "tiers of your configuration)"
        )
    names = tuple(t.name for t in load_config(config_path).tiers)
    return names, f"the tiers of {config_path} are {', '.join(names)}"


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq keys``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in STORE_ACTIONS:  # keys in the store, over the Admin API
        from fairq_server.tools.stored_keys import main as stored_keys

        return stored_keys(argv)
    parser = argparse.ArgumentParser(prog="fairq keys", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    for action, what in STORE_ACTIONS.items():
        sub.add_parser(action, help=f"{what} (see fairq keys {action} --help)", add_help=False)
    new = sub.add_parser("new", help="print a fresh key once, and its [[keys]] entry")
    new.add_argument("--user", required=True, help="the user the key identifies")
    new.add_argument(
        "--max-tier",
        metavar="TIER",
        help="the highest tier the key may use, and its default; every lower tier may be "
        "requested too (default: the first tier)",
    )
    new.add_argument(
        "--tiers",
        default="",
        metavar="A,B",
        help="older spelling, comma-separated: the highest tier listed is the ceiling and "
        "every lower tier may be used, listed or not (prefer --max-tier)",
    )
    new.add_argument(
        "--config",
        metavar="FILE",
        help="fairq's configuration file: check tier names against its [[tiers]]",
    )
    new.add_argument("--admin", action="store_true", help="may call the Admin service")
    new.add_argument("--weight", type=float, help="share of service under vtc fairness")
    new.add_argument("--group", help="metrics label for this user's traffic")
    new.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    args = parser.parse_args(argv)
    user = args.user.strip()
    if not user or len(user) > MAX_KEY_USER_CHARS:
        parser.error(f"--user must be 1-{MAX_KEY_USER_CHARS} characters")
    if args.max_tier is not None and args.tiers:
        parser.error("give --max-tier or --tiers, not both")
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    if args.max_tier is not None:
        tiers = [args.max_tier.strip()]
    try:
        known, source = _tier_names(args.config)
    except (OSError, ConfigError) as exc:
        parser.error(f"--config: {exc}")
    unknown = [t for t in tiers if t not in known]
    if unknown:
        # The server refuses an entry naming a tier it does not have: say so now, not at load.
        parser.error(f"unknown tier {', '.join(repr(t) for t in unknown)}: {source}")
    if args.weight is not None and not args.weight > 0:
        parser.error("--weight must be above 0")
    key = new_key()
    digest = hash_key(key)
    entry = key_entry(user, digest, tiers=tiers, admin=args.admin, weight=args.weight,
                      group=args.group)  # fmt: skip
    if args.json:
        print(json.dumps({"user": user, "key": key, "sha256": digest, "toml": entry}))
        return 0
    print(f"API key for {user} (shown once; give it to the user, it is not stored):\n")
    print(f"    {key}\n")
    print("Add this to fairq's configuration, then reload (SIGHUP) or restart:\n")
    print(entry, end="")
    sys.stdout.flush()
    return 0
