"""Identity: turn request metadata into a :class:`Principal`.

API keys are configured as SHA-256 digests, so the configuration file never holds a usable
secret. A presented key is hashed and the digest compared in constant time. A bearer token
shaped like a JWT (three dot-separated base64url parts; fairq's keys hold no dots) is verified
against the identity provider's keys instead (:mod:`fairq_server.identity`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fairq_server.config.identity import JwtConfig, KeyConfig
from fairq_server.errors import ConfigError, PermissionDeniedError, UnauthenticatedError
from fairq_server.identity.api_keys import KEY_PREFIX, hash_key, new_key
from fairq_server.identity.jwks import source_for
from fairq_server.identity.jwt import JwtVerifier, looks_like_jwt
from fairq_server.identity.keyset import JwksError
from fairq_server.runtime.log_throttle import Throttled

__all__ = [
    "ANONYMOUS_USER",
    "KEY_PREFIX",
    "REFUSAL_LOG_SECONDS",
    "Authenticator",
    "KeySource",
    "Principal",
    "hash_key",
    "new_key",
]

ANONYMOUS_USER = "anonymous"
_MAX_USER_CHARS = 128

log = logging.getLogger(__name__)

#: Seconds between two log lines of refused API keys (the rest are counted in the next).
REFUSAL_LOG_SECONDS = 10.0


@dataclass(frozen=True)
class Principal:
    """Who is calling, and what they may do.

    Attributes:
        user: the fairness identity (one queue per user).
        tiers: tier names this principal may use; the first in tier order is its ceiling.
        admin: may call the Admin service.
        weight: share of service relative to other users (vtc fairness).
        group: low-cardinality label for fairq's own metrics.
        team: the team the user belongs to, and the usage ledger charges (None: no team;
            the user is its own team).

    User and team names are kept verbatim (any text but control characters, bounded in
    length): a key's user and a token's user claim of the same text are the same user.

    """

    user: str
    tiers: frozenset[str]
    admin: bool = False
    weight: float = 1.0
    group: str = "default"
    team: str | None = None


class KeySource(Protocol):
    """Keys kept outside the configuration file (the store), consulted after the file's."""

    def has_keys(self) -> bool:
        """Return True when the source holds a usable key (so open mode ends)."""
        ...

    def lookup(self, digest: bytes) -> Principal | None:
        """Return the principal of the key with SHA-256 ``digest``, None if unknown."""
        ...

    def refused(self, digest: bytes) -> str | None:
        """Say which key ``digest`` is and why it is refused (revoked, expired); None if unknown.

        For the server's log only: the caller is told "invalid API key" either way.
        """
        ...


class Authenticator:
    """Resolves gRPC metadata (or HTTP headers) to a principal.

    With no keys and no ``[jwt]`` configured (local development) every caller is trusted: the
    ``x-fairq-user`` metadata value names the user, every tier is allowed, and Admin calls
    are allowed.
    """

    def __init__(
        self,
        keys: Iterable[KeyConfig],
        tier_names: Sequence[str],
        jwt: JwtConfig | None = None,
    ) -> None:
        """Build the key table and the JWT verifier.

        Raises:
            ConfigError: ``jwt.jwks_file`` or ``jwt.jwks_ca_file`` cannot be used.

        """
        self._tier_names = tuple(tier_names)
        self._keys: list[tuple[bytes, Principal]] = []
        self._jwt: JwtVerifier | None = None
        self._warned_ignored_key = False
        self._sources: list[KeySource] = []
        # Refused keys come with every request of a misconfigured client: one line per
        # interval, with the count of the rest.
        self._refusals = Throttled(REFUSAL_LOG_SECONDS, log)
        self.update(keys)
        self._jwt = self.prepare_jwt(jwt)

    def add_source(self, source: KeySource) -> None:
        """Also accept the keys ``source`` holds (the store's)."""
        self._sources.append(source)

    def update(self, keys: Iterable[KeyConfig]) -> None:
        """Replace the configured keys (configuration reload).

        Raises:
            ValueError: a digest is not hex; the keys in use are unchanged.

        """
        self.install(self.prepare(keys))

    def prepare(self, keys: Iterable[KeyConfig]) -> list[tuple[bytes, Principal]]:
        """Build the key table for ``keys`` without installing it (see :meth:`install`).

        Raises:
            ValueError: a digest is not hex.

        """
        entries = []
        for key in keys:
            tiers = frozenset(key.tiers or self._tier_names)
            principal = Principal(
                key.user, tiers, key.admin, key.weight, key.group, team=key.team or None
            )
            entries.append((bytes.fromhex(key.sha256), principal))
        return entries

    def install(self, entries: list[tuple[bytes, Principal]]) -> None:
        """Make a table from :meth:`prepare` the one in use."""
        self._keys = entries

    def prepare_jwt(self, config: JwtConfig | None) -> JwtVerifier | None:
        """Build the JWT verifier for ``config`` without installing it (configuration reload).

        An unchanged JWKS URL keeps the keys already fetched.

        Raises:
            ConfigError: ``jwt.jwks_file`` cannot be read or holds no usable key, or
                ``jwt.jwks_ca_file`` cannot be read.

        """
        if config is None:
            return None
        previous = self._jwt.source if self._jwt is not None else None
        try:
            source = source_for(config, previous)
        except JwksError as exc:
            raise ConfigError(str(exc)) from None
        return JwtVerifier(config, source, self._tier_names)

    async def install_jwt(self, verifier: JwtVerifier | None) -> None:
        """Make a verifier from :meth:`prepare_jwt` the one in use.

        The replaced verifier's JWKS source is closed, unless the new one took it over.
        """
        old, self._jwt = self._jwt, verifier
        if old is not None and (verifier is None or verifier.source is not old.source):
            await old.source.close()
        if verifier is not None and (old is None or verifier.source is not old.source):
            await verifier.source.start()

    async def start(self) -> None:
        """Fetch the identity provider's keys a first time (a failure is logged)."""
        if self._jwt is not None:
            await self._jwt.source.start()

    async def close(self) -> None:
        """Release the JWKS source's connections."""
        if self._jwt is not None:
            await self._jwt.source.close()

    @property
    def open_mode(self) -> bool:
        """True when no keys, no key source's keys and no JWT identities are configured."""
        return not self._keys and self._jwt is None and not any(s.has_keys() for s in self._sources)

    async def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        """Return the caller's principal.

        Raises:
            UnauthenticatedError: keys or JWTs are configured and nothing valid was presented.

        """
        md = {k.lower(): v for k, v in metadata}
        if self.open_mode:
            if "authorization" in md and not self._warned_ignored_key:
                # Once per process: a client sending a key to a key-less server believes it is
                # someone it is not (every such caller is the x-fairq-user name or anonymous).
                self._warned_ignored_key = True
                log.warning(
                    "a caller sent an API key, but no [[keys]] are configured (open mode): "
                    "the key is ignored and the caller is named by x-fairq-user, else "
                    "'anonymous' (logged once)"
                )
            user = md.get("x-fairq-user", ANONYMOUS_USER)
            user = user.decode(errors="replace") if isinstance(user, bytes) else user
            if not user or len(user) > _MAX_USER_CHARS:
                user = ANONYMOUS_USER
            return Principal(user, frozenset(self._tier_names), admin=True)
        header = md.get("authorization")
        if header is None:
            raise UnauthenticatedError("missing 'authorization: Bearer <api key>' metadata")
        if isinstance(header, bytes):
            header = header.decode(errors="replace")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise UnauthenticatedError("authorization metadata must be 'Bearer <api key>'")
        if looks_like_jwt(token):
            return await self._from_jwt(token)
        return self._from_key(token)

    async def _from_jwt(self, token: str) -> Principal:
        if self._jwt is None:
            raise UnauthenticatedError(
                "the bearer token is a JWT, but this server takes no JWTs (no [jwt] "
                "configured); use an API key"
            )
        identity = await self._jwt.verify(token)
        return Principal(
            identity.user,
            identity.tiers,
            identity.admin,
            group=self._jwt.config.group,
            team=identity.team,
        )

    def _from_key(self, token: str) -> Principal:
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        # Compare against every key so the time taken does not depend on which one matched.
        for stored, principal in self._keys:
            if hmac.compare_digest(stored, digest):
                found = principal
        for source in self._sources:
            found = found or source.lookup(digest)
        if found is None:
            # The operator can tell a revoked or expired key (a client to update) from an
            # unknown one (a typo, or someone guessing); the caller is not told which.
            why = next((w for s in self._sources if (w := s.refused(digest))), None)
            self._refusals.log(logging.INFO, "API key refused: %s", why or "not a known key")
            raise UnauthenticatedError("invalid API key")
        return found

    @staticmethod
    def require_admin(principal: Principal) -> None:
        """Raise :class:`PermissionDeniedError` unless ``principal`` is an admin."""
        if not principal.admin:
            raise PermissionDeniedError(f"user '{principal.user}' is not an admin")
