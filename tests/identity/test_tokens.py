"""Bearer JWTs through the Authenticator: what is accepted, what is refused and why."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from fairq_server.config.identity import JwtConfig
from fairq_server.config.schema import KeyConfig
from fairq_server.errors import UnauthenticatedError
from fairq_server.identity.auth import Authenticator, Principal, hash_key

from .idp import (
    AUDIENCE,
    ISSUER,
    TIERS,
    JwksServer,
    SigningKey,
    claims,
    hs256_with_public_key,
    jwks,
    serve_jwks,
    unsigned,
)

RSA = SigningKey.rsa("rsa-1")
EC = SigningKey.ec("ec-1")


@dataclass
class Idp:
    server: JwksServer

    def config(self, **kw: Any) -> JwtConfig:
        return JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=self.server.url, **kw)

    async def auth(self, keys: tuple[KeyConfig, ...] = (), **kw: Any) -> Authenticator:
        auth = Authenticator(keys, TIERS, self.config(**kw))
        await auth.start()
        self.made.append(auth)
        return auth

    made: list[Authenticator]


@pytest.fixture
async def idp() -> AsyncIterator[Idp]:
    async with serve_jwks(jwks(RSA, EC)) as (server, _):
        made = Idp(server, [])
        yield made
        for auth in made.made:
            await auth.close()


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def refused(auth: Authenticator, token: str) -> str:
    with pytest.raises(UnauthenticatedError) as info:
        await auth.authenticate(bearer(token))
    message = str(info.value)
    for part in token.split("."):
        if len(part) > 8:
            assert part not in message  # the token is never echoed
    return message


async def test_rs256_and_es256_tokens_make_principals(idp: Idp) -> None:
    auth = await idp.auth(team_claim="team")
    assert not auth.open_mode
    p = await auth.authenticate(bearer(RSA.sign(claims("alice"))))
    assert p == Principal("alice", frozenset(TIERS), admin=False, team=None)
    p = await auth.authenticate(bearer(EC.sign(claims("bob", team="ml-research"))))
    assert (p.user, p.team, p.admin) == ("bob", "ml-research", False)
    assert idp.server.fetches == 1  # fetched at start, then cached


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: RSA.sign(claims(exp=int(time.time()) - 60)), "JWT expired"),
        (lambda: EC.sign(claims(iss="https://evil.example")), "issuer is not accepted"),
        (lambda: RSA.sign(claims(aud="another-service")), "audience is not accepted"),
        (lambda: RSA.sign(claims(nbf=int(time.time()) + 600)), "not valid yet"),
        (lambda: unsigned(claims(), RSA.kid), "algorithm 'none' is not accepted"),
        (lambda: hs256_with_public_key(claims(), RSA), "algorithm 'HS256' is not accepted"),
        (lambda: SigningKey.rsa(RSA.kid).sign(claims()), "bad signature"),
        (lambda: SigningKey.ec(EC.kid).sign(claims()), "bad signature"),
        (lambda: RSA.sign({k: v for k, v in claims().items() if k != "exp"}), "no 'exp' claim"),
        (lambda: RSA.sign({k: v for k, v in claims().items() if k != "aud"}), "no 'aud' claim"),
        (lambda: RSA.sign(claims(), kid=EC.kid), "not the one its key is for"),
        (lambda: RSA.sign(claims(), kid=""), "no key id"),
        (lambda: "eyJhbGciOi.eyJzdWIi.c2ln", "malformed JWT"),
    ],
    ids=[
        "expired", "issuer", "audience", "nbf", "alg-none", "hs256-public-key", "rsa-signature",
        "ec-signature", "no-exp", "no-aud", "kid-of-other-key-type", "no-kid", "garbage",
    ],
)  # fmt: skip
async def test_refusals_say_what_was_wrong(idp: Idp, make: Any, needle: str) -> None:
    auth = await idp.auth()
    assert needle in await refused(auth, make())


async def test_leeway_tolerates_small_clock_skew_only(idp: Idp) -> None:
    token = RSA.sign(claims(exp=int(time.time()) - 10))
    assert (await (await idp.auth(leeway_seconds=30)).authenticate(bearer(token))).user == "alice"
    assert "JWT expired" in await refused(await idp.auth(leeway_seconds=0), token)


async def test_missing_user_claim_is_refused_clearly(idp: Idp) -> None:
    auth = await idp.auth(user_claim="preferred_username")
    assert "no 'preferred_username' claim, which names the user" in await refused(
        auth, RSA.sign(claims())
    )
    p = await auth.authenticate(bearer(RSA.sign(claims(preferred_username="a.lovelace"))))
    assert p.user == "a.lovelace"


async def test_tiers_claim_as_list_or_space_separated_string(idp: Idp) -> None:
    auth = await idp.auth(tiers_claim="realm_access.roles", default_tiers=("batch",))
    as_list = claims(realm_access={"roles": ["offline_access", "standard", "batch"]})
    p = await auth.authenticate(bearer(RSA.sign(as_list)))
    assert p.tiers == frozenset({"standard", "batch"})  # values naming no tier are ignored
    auth = await idp.auth(tiers_claim="scope", default_tiers=("batch",))
    p = await auth.authenticate(bearer(RSA.sign(claims(scope="openid interactive email"))))
    assert p.tiers == frozenset({"interactive"})
    p = await auth.authenticate(bearer(RSA.sign(claims())))  # no claim: the default tiers
    assert p.tiers == frozenset({"batch"})
    p = await auth.authenticate(bearer(RSA.sign(claims(scope="openid"))))
    assert p.tiers == frozenset()  # the claim names no tier: none (PERMISSION_DENIED later)
    assert "must be a list or a string" in await refused(auth, RSA.sign(claims(scope=3)))


@pytest.mark.parametrize(
    ("claim", "value", "admin"),
    [
        ("groups", ["users", "fairq-admins"], True),
        ("groups", ["users"], False),
        ("scope", "openid fairq-admins", True),
        ("https://example.com/claims.roles", ["fairq-admins"], True),  # dotted claim name
    ],
)
async def test_admin_claim(idp: Idp, claim: str, value: Any, admin: bool) -> None:
    auth = await idp.auth(admin_claim=claim, admin_value="fairq-admins")
    p = await auth.authenticate(bearer(RSA.sign(claims(**{claim: value}))))
    assert p.admin is admin


async def test_boolean_admin_claim(idp: Idp) -> None:
    auth = await idp.auth(admin_claim="is_admin", admin_value="true")
    assert (await auth.authenticate(bearer(RSA.sign(claims(is_admin=True))))).admin
    assert not (await auth.authenticate(bearer(RSA.sign(claims(is_admin=False))))).admin


async def test_names_are_verbatim_and_never_collide(idp: Idp) -> None:
    auth = await idp.auth(team_claim="team")
    long_a, long_b = "ü" * 199 + "a", "ü" * 199 + "b"  # equal for their first 199 characters
    key_shaped = "fq_" + "A" * 43
    seen = set()
    for user, team in [(long_a, "é" * 256), (long_b, None), (key_shaped, ["🚀 team"])]:
        extra = {} if team is None else {"team": team}
        p = await auth.authenticate(bearer(EC.sign(claims(user, **extra))))
        assert p.user == user
        assert p.team == (team[0] if isinstance(team, list) else team)
        seen.add(p.user)
    assert len(seen) == 3
    # A user with no team has none (it is its own team), whatever a team of its name exists.
    p = await auth.authenticate(bearer(EC.sign(claims("ml"))))
    q = await auth.authenticate(bearer(EC.sign(claims("someone", team="ml"))))
    assert (p.user, p.team) == ("ml", None) and (q.user, q.team) == ("someone", "ml")
    assert "longer than 256" in await refused(auth, EC.sign(claims("x" * 257)))
    assert "control characters" in await refused(auth, EC.sign(claims("eve\nINFO forged")))
    assert "names 2 teams" in await refused(auth, EC.sign(claims(team=["a", "b"])))
    assert (await auth.authenticate(bearer(EC.sign(claims(team=""))))).team is None


async def test_api_keys_keep_working_beside_jwts(idp: Idp) -> None:
    key = KeyConfig("svc", hash_key("fq_service-key"), team="platform")
    auth = await idp.auth(keys=(key,))
    p = await auth.authenticate(bearer("fq_service-key"))
    assert (p.user, p.team) == ("svc", "platform")
    assert (await auth.authenticate(bearer(RSA.sign(claims())))).user == "alice"
    assert "invalid API key" in await refused(auth, "fq_other")


async def test_a_jwt_without_jwt_configured_is_refused_clearly() -> None:
    auth = Authenticator([KeyConfig("svc", hash_key("k"))], TIERS)
    with pytest.raises(UnauthenticatedError, match=r"no \[jwt\] configured"):
        await auth.authenticate(bearer(RSA.sign(claims())))


async def test_an_unknown_key_id_is_logged_once_per_interval_not_per_request(
    idp: Idp, caplog: pytest.LogCaptureFixture
) -> None:
    # Once: a line at INFO for every request (3,780 lines in 26 s from one stuck client).
    auth = await idp.auth()
    caplog.set_level(logging.INFO, logger="fairq_server.identity.jwt")
    for _ in range(50):
        assert "kid) is unknown" in await refused(auth, RSA.sign(claims(), kid="retired"))
    lines = [r for r in caplog.records if "unknown key id" in r.getMessage()]
    assert len(lines) == 1 and "retired" in lines[0].getMessage(), lines
