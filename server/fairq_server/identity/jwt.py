"""Bearer JWTs from the organisation's identity provider, turned into identities.

A token is checked in this order, each failure refused with a message saying what was wrong
(never the token itself): its algorithm is one configured (asymmetric only, so ``alg: none``
and HS* signed with a public key are refused before any key is looked at); its key id is in
the identity provider's JWKS (fetched again once when it is not, see :mod:`.jwks`); the
signature verifies with that key, bound to that algorithm; ``iss``, ``aud``, ``exp`` and
``nbf`` hold (``exp`` is required); and the user claim is present. Verification is PyJWT's.

A client sends the same token with every request until it expires, and verifying one costs
hundreds of microseconds (the signature, and PyJWT's checks of each base64 part), so a
verified token's identity is remembered, by the token's SHA-256, until its ``exp``: a repeat
costs a hash and a lookup. A remembered token is still refused once expired, or once its key
id has left the JWKS.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from jwt import exceptions as jwt_errors

from fairq_server.config.identity import JwtConfig, audiences
from fairq_server.errors import UnauthenticatedError
from fairq_server.identity.jwks import JwksSource
from fairq_server.identity.keyset import JwksError, KeyMismatchError
from fairq_server.names import check_name, escape
from fairq_server.runtime.log_throttle import Throttled

__all__ = ["JwtVerifier", "TokenIdentity", "looks_like_jwt"]

log = logging.getLogger(__name__)

#: Seconds between two log lines of tokens refused for an unknown key id (the rest counted).
UNKNOWN_KID_LOG_SECONDS = 10.0

# Three base64url parts; the signature is empty in an unsigned (alg: none) token, which must
# still reach this path to be refused as such. fairq's own API keys hold no dots.
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_MISSING = object()
#: Verified tokens remembered (least recently used dropped first).
CACHED_TOKENS = 4096

# PyJWT's errors, most specific first, and what the caller is told.
_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (jwt_errors.ExpiredSignatureError, "JWT expired"),
    (jwt_errors.ImmatureSignatureError, "JWT is not valid yet (nbf or iat in the future)"),
    (jwt_errors.InvalidAudienceError, "JWT audience is not accepted here"),
    (jwt_errors.InvalidIssuerError, "JWT issuer is not accepted here"),
    (jwt_errors.InvalidSignatureError, "JWT signature does not verify (bad signature)"),
    (jwt_errors.InvalidKeyError, "JWT key is not acceptable (too short or malformed)"),
    (jwt_errors.InvalidAlgorithmError, "JWT algorithm is not accepted"),
)


def looks_like_jwt(token: str) -> bool:
    """Return True if ``token`` has the shape of a JWT (three dot-separated base64url parts)."""
    return _JWT_SHAPE.fullmatch(token) is not None


@dataclass(frozen=True)
class TokenIdentity:
    """Who a verified token says its bearer is.

    Attributes:
        user: the user claim, verbatim.
        team: the team claim, verbatim (None: no team; the user is its own team).
        tiers: configured tier names the token may use.
        admin: the admin claim holds the admin value.

    """

    user: str
    team: str | None
    tiers: frozenset[str]
    admin: bool


class JwtVerifier:
    """Verifies bearer JWTs against one identity provider's keys."""

    def __init__(
        self,
        config: JwtConfig,
        source: JwksSource,
        tier_names: Sequence[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._clock = clock
        # SHA-256 of a token -> (its identity, its key id, its exp).
        self._verified: OrderedDict[bytes, tuple[TokenIdentity, str, float]] = OrderedDict()
        # A client stuck on a retired key id sends it with every request: a line per
        # request (thousands a minute) would drown the log.
        self._unknown_kid = Throttled(UNKNOWN_KID_LOG_SECONDS, log)
        self.source = source
        self._tier_names = frozenset(tier_names)
        self._default_tiers = frozenset(config.default_tiers or tier_names)
        self._audiences = audiences(config)
        self._decoder = jwt.PyJWT(
            {"require": ["exp", "iss", "aud"], "enforce_minimum_key_length": True}
        )

    async def verify(self, token: str) -> TokenIdentity:
        """Return the identity ``token`` carries.

        Raises:
            UnauthenticatedError: the token is refused; the message says why.

        """
        digest = hashlib.sha256(token.encode()).digest()
        hit = self._verified.get(digest)
        if hit is not None:
            identity, signed_by, exp = hit
            if self._clock() < exp + self.config.leeway_seconds:
                try:
                    known = signed_by in await self.source.keys_for(signed_by)
                except JwksError:
                    known = False
                if known:
                    self._verified.move_to_end(digest)
                    return identity
            del self._verified[digest]  # expired or its key is gone: verify in full
        try:
            header = jwt.get_unverified_header(token)
        except jwt_errors.PyJWTError:
            raise UnauthenticatedError("malformed JWT (its header does not decode)") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.config.algorithms:
            shown = escape(str(alg), 20)
            raise UnauthenticatedError(
                f"JWT algorithm '{shown}' is not accepted (accepted: "
                f"{', '.join(self.config.algorithms)})"
            )
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise UnauthenticatedError("JWT header has no key id (kid)")
        try:
            key = (await self.source.keys_for(kid)).key(kid, alg)
        except JwksError as exc:
            raise UnauthenticatedError(f"cannot verify the JWT now: {exc}") from None
        except KeyMismatchError as exc:
            raise UnauthenticatedError(str(exc)) from None
        if key is None:
            self._unknown_kid.log(logging.INFO, "JWT refused: unknown key id %s", escape(kid, 100))
            raise UnauthenticatedError(
                "JWT key id (kid) is unknown: not in the identity provider's JWKS"
            )
        try:
            claims = self._decoder.decode(
                token,
                key,
                algorithms=[alg],
                audience=self._audiences,
                issuer=self.config.issuer,
                leeway=self.config.leeway_seconds,
            )
        except jwt_errors.MissingRequiredClaimError as exc:
            raise UnauthenticatedError(f"JWT has no '{exc.claim}' claim") from None
        except jwt_errors.PyJWTError as exc:
            reason = next((r for t, r in _REASONS if isinstance(exc, t)), "malformed JWT")
            raise UnauthenticatedError(reason) from None
        identity = self._identity(claims)
        self._verified[digest] = (identity, kid, float(claims["exp"]))
        if len(self._verified) > CACHED_TOKENS:
            self._verified.popitem(last=False)
        return identity

    def _identity(self, claims: Mapping[str, Any]) -> TokenIdentity:
        config = self.config
        user = _claim(claims, config.user_claim)
        if user is _MISSING:
            raise UnauthenticatedError(
                f"JWT has no '{config.user_claim}' claim, which names the user here"
            )
        team = _claim(claims, config.team_claim) if config.team_claim else _MISSING
        tiers = self._default_tiers
        if config.tiers_claim:
            raw = _claim(claims, config.tiers_claim)
            if raw is not _MISSING:
                tiers = frozenset(_values(raw, config.tiers_claim)) & self._tier_names
        admin = False
        if config.admin_claim:
            raw = _claim(claims, config.admin_claim)
            admin = raw is not _MISSING and config.admin_value in _values(raw, config.admin_claim)
        return TokenIdentity(
            user=_name(user, config.user_claim),
            team=None if team is _MISSING else _team(team, config.team_claim),
            tiers=tiers,
            admin=admin,
        )


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    """Return the claim ``name``: a top-level claim so named, else a dotted path into objects."""
    if name in claims:
        return claims[name]
    node: Any = claims
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _values(raw: object, claim: str) -> list[str]:
    """Return a list claim's strings, a string claim's words, or a boolean's name."""
    if isinstance(raw, bool):
        return ["true" if raw else "false"]
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, list):
        return [v for v in raw if isinstance(v, str)]
    raise UnauthenticatedError(f"JWT claim '{claim}' must be a list or a string")


def _name(raw: object, claim: str) -> str:
    """Return a user or team name from a claim, verbatim (a number as its decimal text)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    try:
        return check_name(raw, f"JWT claim '{claim}'")
    except ValueError as exc:
        raise UnauthenticatedError(str(exc)) from None


def _team(raw: object, claim: str) -> str | None:
    """Return the team: a string, or a list of at most one (empty or null: no team)."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, list):
        if not raw:
            return None
        if len(raw) > 1:
            raise UnauthenticatedError(
                f"JWT claim '{claim}' names {len(raw)} teams; one team is expected"
            )
        raw = raw[0]
    return _name(raw, claim)
