"""The [jwt] section and key teams: a bad value is a clear error naming its key."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from fairq_server.config.loader import parse_config
from fairq_server.config.schema import ConfigError

KEY = {"user": "alice", "sha256": "a" * 64}
JWT = {"issuer": "https://sso.example.test", "audience": "fairq", "jwks_url": "https://sso/certs"}


def test_a_typical_jwt_section_parses() -> None:
    config = parse_config(
        tomllib.loads(
            """
            [jwt]
            issuer = "https://login.microsoftonline.com/TENANT/v2.0"
            audience = ["api://fairq", "fairq"]
            jwks_url = "https://login.microsoftonline.com/TENANT/discovery/v2.0/keys"
            user_claim = "oid"
            tiers_claim = "roles"
            default_tiers = ["batch"]
            admin_claim = "roles"
            admin_value = "Fairq.Admin"
            leeway_seconds = 60
            """
        )
    )
    assert config.jwt is not None
    assert config.jwt.audience == ("api://fairq", "fairq")
    assert config.jwt.algorithms == ("RS256", "ES256")


@pytest.mark.parametrize(
    ("jwt", "needle"),
    [
        ({"audience": "fairq", "jwks_url": "https://sso/certs"}, "jwt.issuer is required"),
        ({**JWT, "audience": []}, "jwt.audience is required"),
        ({**JWT, "audience": ["fairq", 3]}, "jwt.audience: expected a string or a list of strings"),
        ({**JWT, "jwks_file": "/etc/jwks.json"}, "exactly one of jwt.jwks_url and jwt.jwks_file"),
        ({k: v for k, v in JWT.items() if k != "jwks_url"}, "exactly one of"),
        ({**JWT, "jwks_url": "ftp://sso/certs"}, "jwt.jwks_url must be an http:// or https://"),
        ({**JWT, "algorithms": ["HS256"]}, "jwt.algorithms: 'HS256' is not accepted"),
        ({**JWT, "algorithms": ["none"]}, "jwt.algorithms: 'none' is not accepted"),
        ({**JWT, "algorithms": "RS256"}, "jwt.algorithms: expected a list of strings"),
        ({**JWT, "algorithms": []}, "jwt.algorithms must list at least one"),
        ({**JWT, "user_claim": ""}, "jwt.user_claim must be a non-empty string"),
        ({**JWT, "admin_claim": "roles"}, "jwt.admin_claim and jwt.admin_value are set together"),
        ({**JWT, "default_tiers": ["gold"]}, "jwt.default_tiers: unknown tiers ['gold']"),
        ({**JWT, "leeway_seconds": 3600}, "jwt.leeway_seconds must be at most 300"),
        ({**JWT, "leeway_seconds": -1}, "jwt.leeway_seconds must be 0 or more"),
        ({**JWT, "leeway_seconds": "30"}, "jwt.leeway_seconds: expected a number"),
        ({**JWT, "jwks_max_bytes": 0}, "jwt.jwks_max_bytes must be above 0"),
        ({**JWT, "jwks_file_path": "x"}, "jwt: unknown keys ['jwks_file_path']"),
        ({**JWT, "jwks_url": "", "jwks_file": "/x", "jwks_ca_file": "/ca"}, "jwks_ca_file applies"),
    ],
)
def test_bad_jwt_sections_are_refused_naming_the_key(jwt: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"jwt": jwt})
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("team", "needle"),
    [
        ("x" * 257, "keys[0].team is longer than 256 characters"),
        ("ml\nresearch", "keys[0].team contains control characters"),
        (3, "keys[0].team: expected a string"),
    ],
)
def test_bad_key_teams_are_refused(team: object, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"keys": [{**KEY, "team": team}]})
    assert needle in str(info.value)


def test_key_teams_are_kept_verbatim() -> None:
    for team in ("ML Research 🚀", "fq_" + "A" * 43, "é" * 256):
        [key] = parse_config({"keys": [{**KEY, "team": team}]}).keys
        assert key.team == team
    [key] = parse_config({"keys": [KEY]}).keys
    assert key.team == ""  # no team: the user is its own team
