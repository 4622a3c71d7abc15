"""One JWKS document, parsed: the identity provider's public signing keys by key id.

A JWKS is read from the network or a file, so every part of it is checked: a document that is
not a JSON object with a ``keys`` list is refused whole; a key that is not a usable public
signing key (a symmetric ``oct`` key, an encryption key, a malformed one) is skipped and
named in the log, so one odd entry does not lock every user out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from jwt import PyJWK
from jwt.exceptions import PyJWTError

from fairq_server.names import escape

__all__ = ["MAX_KEYS", "JwksError", "KeyMismatchError", "KeySet", "parse_jwks"]

log = logging.getLogger(__name__)

#: Keys kept from one JWKS (identity providers publish a handful; rotation adds one).
MAX_KEYS = 64
_MAX_KID_CHARS = 256
# The key type (and curve) each algorithm family verifies with.
_KTY = {"RS": "RSA", "PS": "RSA", "ES": "EC"}
_CURVE = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}


class JwksError(ValueError):
    """A JWKS could not be fetched, read or parsed; the message says why."""


class KeyMismatchError(ValueError):
    """A token's algorithm does not fit the key its key id names."""


class KeySet:
    """Public keys by key id; a key is prepared for an algorithm on first use."""

    def __init__(self, keys: Mapping[str, Mapping[str, Any]]) -> None:
        self._jwks = dict(keys)
        self._prepared: dict[tuple[str, str], PyJWK] = {}

    def __contains__(self, kid: object) -> bool:
        return kid in self._jwks

    def __len__(self) -> int:
        return len(self._jwks)

    @property
    def kids(self) -> frozenset[str]:
        """The key ids in this set."""
        return frozenset(self._jwks)

    def key(self, kid: str, alg: str) -> PyJWK | None:
        """Return the key ``kid`` prepared to verify ``alg``, or None if there is no such kid.

        The algorithm is bound to the key here, so a token cannot choose how its signature is
        checked beyond what the key itself allows.

        Raises:
            KeyMismatchError: the key's type, curve or declared ``alg`` does not fit ``alg``.

        """
        jwk = self._jwks.get(kid)
        if jwk is None:
            return None
        prepared = self._prepared.get((kid, alg))
        if prepared is not None:
            return prepared
        declared = jwk.get("alg")
        if declared is not None and declared != alg:
            raise KeyMismatchError("the JWT's algorithm is not the one its key is for")
        if jwk.get("kty") != _KTY.get(alg[:2]) or (alg in _CURVE and jwk.get("crv") != _CURVE[alg]):
            raise KeyMismatchError("the JWT's algorithm does not fit the type of its key")
        try:
            prepared = PyJWK(dict(jwk), algorithm=alg)
        except (PyJWTError, TypeError, ValueError) as exc:  # checked in parse_jwks
            raise KeyMismatchError(f"the JWT's key is unusable: {exc}") from None
        self._prepared[(kid, alg)] = prepared
        return prepared


def parse_jwks(data: bytes, where: str) -> KeySet:
    """Parse a JWKS document into its usable public signing keys.

    Args:
        data: the document's bytes (already bounded in size by the reader).
        where: the URL or file it came from, for messages.

    Raises:
        JwksError: not a JSON object with a ``keys`` list, or no usable key in it.

    """
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JwksError(f"JWKS at {where} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise JwksError(f"JWKS at {where} is not a JSON object with a 'keys' list")
    keys: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for i, jwk in enumerate(doc["keys"]):
        reason = _unusable(jwk)
        if reason is None and len(keys) >= MAX_KEYS:
            reason = f"more than {MAX_KEYS} keys"
        if reason is None and jwk["kid"] in keys:
            reason = "duplicate kid"
        if reason is not None:
            skipped.append(f"keys[{i}]: {reason}")
            continue
        keys[jwk["kid"]] = jwk
    if skipped:
        log.warning("JWKS at %s: skipped %s", where, escape("; ".join(skipped)))
    if not keys:
        raise JwksError(f"JWKS at {where} holds no usable public signing key with a kid")
    return KeySet(keys)


def _unusable(jwk: object) -> str | None:
    """Say why ``jwk`` cannot verify tokens, or None if it can."""
    if not isinstance(jwk, dict):
        return "not an object"
    kid = jwk.get("kid")
    if not isinstance(kid, str) or not kid or len(kid) > _MAX_KID_CHARS:
        return f"no kid (a string of 1-{_MAX_KID_CHARS} characters)"
    if jwk.get("use", "sig") != "sig":
        return "not a signing key (use is not 'sig')"
    if jwk.get("kty") not in ("RSA", "EC"):
        return "not an RSA or EC public key"
    if "d" in jwk:
        return "a private key (a JWKS publishes public keys only)"
    try:
        PyJWK(dict(jwk))
    except (PyJWTError, TypeError, ValueError) as exc:
        return f"malformed: {exc}"
    return None
