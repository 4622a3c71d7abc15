"""``fairq keys``: API keys, in fairq's store or in its configuration file.

``create``, ``list``, ``revoke`` and ``rotate`` manage the store's keys over the Admin API
(:mod:`fairq_server.tools.stored_keys`). ``create --file`` makes a key for the configuration
file instead: the key is printed once with the ``[[keys]]`` entry that admits it, and is never
stored (the file holds only its SHA-256 digest); it needs no running fairq. ``keys new`` is
the older spelling of ``keys create --file``, kept for scripts.

This module imports only the standard library and fairq's configuration: the store's actions
load gRPC when they run.
"""

from __future__ import annotations

import argparse
import json
import sys

from fairq_server.config.identity import MAX_KEY_USER_CHARS
from fairq_server.config.schema import DEFAULT_TIERS, ConfigError
from fairq_server.identity.api_keys import KEY_PREFIX, hash_key, new_key
from fairq_server.names import MAX_NAME_CHARS

__all__ = ["KEY_PREFIX", "key_entry", "main", "new_key"]

# Keys in fairq's store (fairq_server.tools.stored_keys), rather than in the file.
STORE_ACTIONS = {
    "create": "make a key: in the store, or with --file for the configuration file",
    "list": "list the store's keys",
    "revoke": "revoke a stored key on every replica",
    "rotate": "replace a stored key",
}
_FILE_FLAG = "--file"


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
    team: str | None = None,
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
    if team:
        lines.append(f"team = {_toml_string(team)}")
    return "\n".join(lines) + "\n"


def _file_settings(config_path: str | None) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """Return the tier names a key may name, a sentence saying which, and the teams."""
    if config_path is None:
        names = tuple(t.name for t in DEFAULT_TIERS)
        return (
            names,
            f"the default tiers are {', '.join(names)} (--config FILE checks against the "
            "tiers of your configuration)",
            (),
        )
    from fairq_server.config.loader import load_config  # the plugin registries: on use only

    config = load_config(config_path)
    names = tuple(t.name for t in config.tiers)
    teams = tuple(t.name for t in config.teams)
    return names, f"the tiers of {config_path} are {', '.join(names)}", teams


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq keys``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["new"]:  # the older spelling
        return _file_key(argv[1:], "fairq keys new")
    if argv[:1] == ["create"] and _FILE_FLAG in argv[1:]:
        rest = [a for a in argv[1:] if a != _FILE_FLAG]
        return _file_key(rest, "fairq keys create --file")
    if argv and argv[0] in STORE_ACTIONS:  # keys in the store, over the Admin API
        from fairq_server.tools.stored_keys import main as stored_keys

        return stored_keys(argv)
    parser = argparse.ArgumentParser(
        prog="fairq keys",
        description="API keys: in fairq's store (create, list, revoke, rotate; over the "
        "Admin API, every replica at once, no reload), or for the configuration file "
        "(create --file: the key and its [[keys]] entry, no running fairq needed).",
    )
    sub = parser.add_subparsers(
        dest="action", required=True, metavar="{" + ",".join(STORE_ACTIONS) + "}"
    )
    for action, what in STORE_ACTIONS.items():
        sub.add_parser(action, help=f"{what} (see fairq keys {action} --help)", add_help=False)
    sub.add_parser("new", add_help=False)  # hidden: the older spelling of create --file
    parser.parse_args(argv)
    return 2  # not reached: every action returned above, and argparse exits on the rest


def _file_key(argv: list[str], prog: str) -> int:
    """Make a key for the configuration file: print it once, with its ``[[keys]]`` entry."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Make an API key for fairq's configuration file: the key is printed once "
        "with the [[keys]] entry that admits it; the file holds only its SHA-256 digest. Add "
        "the entry, then reload (SIGHUP) or restart fairq. No running fairq is needed.",
    )
    parser.add_argument("--user", required=True, help="the user the key identifies")
    parser.add_argument("--team", default="", help="the team the key's user belongs to")
    parser.add_argument(
        "--max-tier",
        metavar="TIER",
        help="the highest tier the key may use, and its default; every lower tier may be "
        "requested too (default: the first tier)",
    )
    # The older spelling, comma-separated: the highest tier listed is the ceiling.
    parser.add_argument("--tiers", default="", metavar="A,B", help=argparse.SUPPRESS)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="fairq's configuration file: check tier and team names against it",
    )
    parser.add_argument("--admin", action="store_true", help="may call the Admin service")
    parser.add_argument("--weight", type=float, help="share of service under vtc fairness")
    parser.add_argument("--group", help="metrics label for this user's traffic")
    parser.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    args = parser.parse_args(argv)
    user = args.user.strip()
    if not user or len(user) > MAX_KEY_USER_CHARS:
        parser.error(f"--user must be 1-{MAX_KEY_USER_CHARS} characters")
    team = args.team.strip()
    if len(team) > MAX_NAME_CHARS:
        parser.error(f"--team must be at most {MAX_NAME_CHARS} characters")
    if args.max_tier is not None and args.tiers:
        parser.error("give --max-tier or --tiers, not both")
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    if args.max_tier is not None:
        tiers = [args.max_tier.strip()]
    try:
        known, source, teams = _file_settings(args.config)
    except (OSError, ConfigError) as exc:
        parser.error(f"--config: {exc}")
    unknown = [t for t in tiers if t not in known]
    if unknown:
        # The server refuses an entry naming a tier it does not have: say so now, not at load.
        parser.error(f"unknown tier {', '.join(repr(t) for t in unknown)}: {source}")
    if team and teams and team not in teams:
        parser.error(f"unknown team {team!r}: the teams of {args.config} are {', '.join(teams)}")
    if args.weight is not None and not args.weight > 0:
        parser.error("--weight must be above 0")
    key = new_key()
    digest = hash_key(key)
    entry = key_entry(user, digest, tiers=tiers, admin=args.admin, weight=args.weight,
                      group=args.group, team=team)  # fmt: skip
    if args.json:
        print(json.dumps({"user": user, "key": key, "sha256": digest, "toml": entry}))
        return 0
    print(f"API key for {user} (shown once; give it to the user, it is not stored):\n")
    print(f"    {key}\n")
    print("Add this to fairq's configuration, then reload (SIGHUP) or restart:\n")
    print(entry, end="")
    sys.stdout.flush()
    return 0
