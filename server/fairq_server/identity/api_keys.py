"""fairq's own API keys: how one is made, and the digest under which it is configured.

Apart from the authenticator (:mod:`fairq_server.identity.auth`), which loads JWT and HTTP
libraries:
``fairq keys create --file`` makes a key with nothing but the standard library.
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["KEY_PREFIX", "hash_key", "new_key"]

#: A recognisable prefix lets secret scanners and people spot a leaked fairq key.
KEY_PREFIX = "fq_"


def hash_key(api_key: str) -> str:
    """Return the hex SHA-256 digest under which ``api_key`` is configured."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def new_key() -> str:
    """Return a fresh API key: the prefix and 256 random bits, URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)
