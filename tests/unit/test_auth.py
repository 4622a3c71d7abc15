"""API keys (hashed), open mode, tier ceilings."""

from __future__ import annotations

import pytest

from fairq_server.config.schema import KeyConfig
from fairq_server.doors.tier import resolve_tier
from fairq_server.errors import InvalidRequestError, PermissionDeniedError, UnauthenticatedError
from fairq_server.identity.auth import Authenticator, Principal, hash_key

TIERS = ("interactive", "standard", "batch")


async def test_keys_are_matched_by_hash_and_never_stored_in_clear() -> None:
    auth = Authenticator([KeyConfig("alice", hash_key("s3cret"), tiers=("batch",))], TIERS)
    principal = await auth.authenticate([("authorization", "Bearer s3cret")])
    assert principal.user == "alice"
    assert principal.tiers == frozenset({"batch"})
    assert "s3cret" not in repr(auth.__dict__)
    with pytest.raises(UnauthenticatedError, match="invalid API key"):
        await auth.authenticate([("authorization", "Bearer s3cre")])


async def test_open_mode_uses_user_metadata() -> None:
    auth = Authenticator([], TIERS)
    assert (await auth.authenticate([("x-fairq-user", "bob")])).user == "bob"
    assert (await auth.authenticate([])).user == "anonymous"
    assert (await auth.authenticate([("x-fairq-user", "x" * 500)])).user == "anonymous"


def test_non_admin_is_refused_admin() -> None:
    with pytest.raises(PermissionDeniedError, match="not an admin"):
        Authenticator.require_admin(Principal("u", frozenset(TIERS)))


def test_tier_resolution() -> None:
    p = Principal("u", frozenset({"standard", "batch"}))
    assert resolve_tier("", p, TIERS) == 1  # the ceiling
    assert resolve_tier("batch", p, TIERS) == 2
    with pytest.raises(PermissionDeniedError, match="above the ceiling 'standard'"):
        resolve_tier("interactive", p, TIERS)
    with pytest.raises(InvalidRequestError, match="unknown tier 'gold'"):
        resolve_tier("gold", p, TIERS)
    # A ceiling lets a key ask for any lower tier, even one not listed.
    only_top = Principal("v", frozenset({"interactive"}))
    assert resolve_tier("batch", only_top, TIERS) == 2
