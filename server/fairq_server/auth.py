"""Identity: turn request metadata into a :class:`Principal`.

API keys are configured as SHA-256 digests, so the configuration file never holds a usable
secret. A presented key is hashed and the digest compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fairq_server.config import KeyConfig
from fairq_server.errors import PermissionDeniedError, UnauthenticatedError

__all__ = ["ANONYMOUS_USER", "Authenticator", "KeySource", "Principal", "hash_key"]

ANONYMOUS_USER = "anonymous"
_MAX_USER_CHARS = 128

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    """Who is calling, and what they may do.

    Attributes:
        user: the fairness identity (one queue per user).
        tiers: tier names this principal may use; the first in tier order is its ceiling.
        admin: may call the Admin service.
        weight: share of service relative to other users (vtc fairness).
        group: low-cardinality label for fairq's own metrics.
        team: the team the usage ledger charges (None: none).

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


def hash_key(api_key: str) -> str:
    """Return the hex SHA-256 digest under which ``api_key`` is configured."""
    return hashlib.sha256(api_key.encode()).hexdigest()


class Authenticator:
    """Resolves gRPC metadata to a principal.

    With no keys configured (local development) every caller is trusted: the
    ``x-fairq-user`` metadata value names the user, every tier is allowed, and Admin calls
    are allowed.
    """

    def __init__(self, keys: Iterable[KeyConfig], tier_names: Sequence[str]) -> None:
        self._tier_names = tuple(tier_names)
        self._keys: list[tuple[bytes, Principal]] = []
        self._warned_ignored_key = False
        self._sources: list[KeySource] = []
        self.update(keys)

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
            principal = Principal(key.user, tiers, key.admin, key.weight, key.group)
            entries.append((bytes.fromhex(key.sha256), principal))
        return entries

    def install(self, entries: list[tuple[bytes, Principal]]) -> None:
        """Make a table from :meth:`prepare` the one in use."""
        self._keys = entries

    @property
    def open_mode(self) -> bool:
        """True when no keys are configured, in the file or in a key source."""
        return not self._keys and not any(s.has_keys() for s in self._sources)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        """Return the caller's principal.

        Raises:
            UnauthenticatedError: keys are configured and none valid was presented.

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
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError("authorization metadata must be 'Bearer <api key>'")
        digest = hashlib.sha256(token.strip().encode()).digest()
        found: Principal | None = None
        # Compare against every key so the time taken does not depend on which one matched.
        for stored, principal in self._keys:
            if hmac.compare_digest(stored, digest):
                found = principal
        for source in self._sources:
            found = found or source.lookup(digest)
        if found is None:
            raise UnauthenticatedError("invalid API key")
        return found

    @staticmethod
    def require_admin(principal: Principal) -> None:
        """Raise :class:`PermissionDeniedError` unless ``principal`` is an admin."""
        if not principal.admin:
            raise PermissionDeniedError(f"user '{principal.user}' is not an admin")
