"""Who a caller may be: the ``[[keys]]`` entries and the ``[jwt]`` section.

The ``[jwt]`` section says which identity provider's tokens fairq accepts, and what they mean.

Example (Keycloak)::

    [jwt]
    issuer = "https://sso.example.com/realms/ml"
    audience = "fairq"                       # or a list: ["fairq", "account"]
    jwks_url = "https://sso.example.com/realms/ml/protocol/openid-connect/certs"
    user_claim = "preferred_username"
    team_claim = "team"
    tiers_claim = "realm_access.roles"       # a list, or a space-separated string
    admin_claim = "realm_access.roles"
    admin_value = "fairq-admin"

No ``[jwt]`` section: bearer JWTs are refused, API keys work as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from fairq_server.config.fields import Bool, Float, Int, Str, doc, section
from fairq_server.names import check_name

__all__ = [
    "ALGORITHMS",
    "MAX_CLAIM_NAME_CHARS",
    "MAX_KEY_USER_CHARS",
    "JwtConfig",
    "KeyConfig",
    "audiences",
    "check_jwt",
]

#: Asymmetric algorithms fairq verifies. HS* (a shared secret) and ``none`` never are: a
#: JWKS publishes public keys, and a public key used as an HMAC secret forges any token.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
#: Longest user name of an API key, in the file or the store.
MAX_KEY_USER_CHARS = 128
MAX_CLAIM_NAME_CHARS = 256
_MAX_LEEWAY_SECONDS = 300.0


@section
@dataclass(frozen=True)
class KeyConfig:
    """An API key, stored only as its SHA-256 digest (hex); ``team`` empty: no team."""

    user: Annotated[Str, doc("the user the key names (the fairness identity)")]
    sha256: Annotated[Str, doc("hex SHA-256 digest of the key (64 hexadecimal digits)")]
    tiers: Annotated[
        tuple[Str, ...],
        doc("the tiers the key may use: the highest listed is its ceiling (empty: every tier)"),
    ] = ()
    admin: Annotated[Bool, doc("the key may make Admin calls and use the console")] = False
    weight: Annotated[Float, doc("the user's fairness weight", gt=0)] = 1.0
    group: Annotated[Str, doc("metrics label of the key's requests")] = "default"
    team: Annotated[Str, doc("the user's team (empty: the user is its own team)")] = ""


@section
@dataclass(frozen=True)
class JwtConfig:
    """How bearer JWTs are verified and turned into principals.

    Claim names may be dotted paths into nested objects (``realm_access.roles``); a claim
    whose own name holds dots (``https://example.com/team``) is found first.
    """

    issuer: Annotated[Str, doc("the ``iss`` every token must carry (required)")] = ""
    audience: Annotated[
        Str | tuple[Str, ...], doc("the ``aud`` a token must carry (one of these; required)")
    ] = ()
    jwks_url: Annotated[
        Str, doc("where the identity provider publishes its signing keys (``https://``)")
    ] = ""
    jwks_file: Annotated[
        Str, doc("or a local JWKS file, re-read when it changes (exactly one of the two)")
    ] = ""
    jwks_ca_file: Annotated[
        Str, doc("CA bundle to verify the JWKS URL's server with (empty: system CAs)")
    ] = ""
    algorithms: Annotated[
        tuple[Str, ...], doc("signature algorithms accepted (asymmetric only)")
    ] = ("RS256", "ES256")
    user_claim: Annotated[Str, doc("claim naming the user (required in every token)")] = "sub"
    team_claim: Annotated[
        Str, doc("claim naming the user's team (empty, or absent from a token: no team)")
    ] = ""
    tiers_claim: Annotated[
        Str,
        doc(
            "claim listing the tiers a token may use (a list, or a space-separated string); "
            "empty, or absent from a token: ``default_tiers``"
        ),
    ] = ""
    default_tiers: Annotated[
        tuple[Str, ...], doc("tiers of a token without a tiers claim (empty: every tier)")
    ] = ()
    admin_claim: Annotated[
        Str,
        doc(
            "claim that grants Admin calls when it holds ``admin_value`` (equal to it, or one "
            "of its values)"
        ),
    ] = ""
    admin_value: Annotated[Str, doc("see ``admin_claim``")] = ""
    group: Annotated[Str, doc("the metrics label (``group``) of every token holder")] = "default"
    leeway_seconds: Annotated[
        Float, doc("clock skew tolerated on ``exp`` and ``nbf`` (at most 300)", ge=0)
    ] = 30.0
    jwks_timeout_seconds: Annotated[
        Float, doc("a JWKS fetch (connect and body) must finish within this", gt=0)
    ] = 5.0
    jwks_max_bytes: Annotated[
        Int, doc("a JWKS larger than this is refused (read no further)", gt=0)
    ] = 256 * 1024
    jwks_cache_seconds: Annotated[
        Float,
        doc(
            "keys older than this are refreshed in the background (the cached ones keep "
            "working while the URL is unreachable)",
            gt=0,
        ),
    ] = 300.0
    jwks_min_refresh_seconds: Annotated[
        Float,
        doc(
            "a token with an unknown key id makes fairq fetch the JWKS again at most once per "
            "this interval",
            ge=0,
        ),
    ] = 30.0


def audiences(config: JwtConfig) -> list[str]:
    """Return the accepted audiences as a list (``audience`` may be one string)."""
    if isinstance(config.audience, str):
        return [config.audience]
    return list(config.audience)


def check_jwt(config: JwtConfig, tier_names: Sequence[str]) -> None:
    """Refuse a ``[jwt]`` section that cannot work, naming the key at fault.

    Types of plain values are checked where the section is read; this checks what they mean.

    Raises:
        ValueError: starting with ``jwt.<key>``.

    """
    if not config.issuer:
        raise ValueError("jwt.issuer is required (the 'iss' of the identity provider's tokens)")
    auds = audiences(config)
    if not auds or not all(isinstance(a, str) and a for a in auds):
        raise ValueError("jwt.audience is required: a non-empty string or list of strings")
    if bool(config.jwks_url) == bool(config.jwks_file):
        raise ValueError("jwt: set exactly one of jwt.jwks_url and jwt.jwks_file")
    if config.jwks_url:
        parts = urlsplit(config.jwks_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"jwt.jwks_url must be an http:// or https:// URL, not {config.jwks_url!r}"
            )
    elif config.jwks_ca_file:
        raise ValueError("jwt.jwks_ca_file applies only to jwt.jwks_url")
    for key in ("algorithms", "default_tiers"):
        value = getattr(config, key)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"jwt.{key} must be a list of strings, not {value!r}")
    if not config.algorithms:
        raise ValueError(f"jwt.algorithms must list at least one of {list(ALGORITHMS)}")
    for alg in config.algorithms:
        if alg not in ALGORITHMS:
            raise ValueError(
                f"jwt.algorithms: {alg!r} is not accepted; use asymmetric ones: {list(ALGORITHMS)}"
            )
    for key in ("user_claim", "team_claim", "tiers_claim", "admin_claim"):
        name = getattr(config, key)
        if key == "user_claim" or name:
            check_name(name, f"jwt.{key}", MAX_CLAIM_NAME_CHARS)
    if bool(config.admin_claim) != bool(config.admin_value):
        raise ValueError("jwt.admin_claim and jwt.admin_value are set together or not at all")
    if config.admin_value:
        check_name(config.admin_value, "jwt.admin_value")
    unknown = [t for t in config.default_tiers if t not in tier_names]
    if unknown:
        raise ValueError(
            f"jwt.default_tiers: unknown tiers {unknown}; tiers are {list(tier_names)}"
        )
    check_name(config.group, "jwt.group", 64)
    if config.leeway_seconds > _MAX_LEEWAY_SECONDS:
        raise ValueError(
            f"jwt.leeway_seconds must be at most {_MAX_LEEWAY_SECONDS:.0f}, not "
            f"{config.leeway_seconds!r}"
        )
    for key in ("jwks_timeout_seconds", "jwks_max_bytes", "jwks_cache_seconds"):
        if getattr(config, key) <= 0:
            raise ValueError(f"jwt.{key} must be above 0, not {getattr(config, key)!r}")
