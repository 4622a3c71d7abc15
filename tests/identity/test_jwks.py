"""Where the keys come from: a JWKS URL (cached, refetched at a bounded rate) or a file."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

from fairq_server.config.identity import JwtConfig
from fairq_server.errors import UnauthenticatedError
from fairq_server.identity.jwks import FileJwks, UrlJwks
from fairq_server.identity.jwt import JwtVerifier
from fairq_server.identity.keyset import JwksError, parse_jwks

from .idp import AUDIENCE, ISSUER, TIERS, SigningKey, claims, jwks, serve_jwks, tls_files

OLD = SigningKey.rsa("2026-old")
NEW = SigningKey.ec("2026-new")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def url_verifier(url: str, clock: Clock, **kw: Any) -> JwtVerifier:
    config = JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=url, **kw)
    return JwtVerifier(config, UrlJwks(config, clock=clock), TIERS)


async def refusal(verifier: JwtVerifier, token: str) -> str:
    with pytest.raises(UnauthenticatedError) as info:
        await verifier.verify(token)
    return str(info.value)


async def test_rotation_is_picked_up_and_bogus_kids_cannot_hammer_the_idp() -> None:
    clock = Clock()
    async with serve_jwks(jwks(OLD)) as (idp, _):
        verifier = url_verifier(idp.url, clock, jwks_min_refresh_seconds=30)
        await verifier.source.start()
        assert (await verifier.verify(OLD.sign(claims()))).user == "alice"
        # The provider rotates: a new key appears in its JWKS, tokens start using it.
        idp.document = jwks(OLD, NEW)
        clock.now += 31
        assert (await verifier.verify(NEW.sign(claims("bob")))).user == "bob"
        assert idp.fetches == 2
        # Made-up key ids: at most one fetch per interval, however many tokens carry them.
        bogus = [SigningKey.ec(f"bogus-{i}") for i in range(3)]
        for i in range(200):
            message = await refusal(verifier, bogus[i % 3].sign(claims()))
            assert "key id (kid) is unknown" in message
        assert idp.fetches == 2  # the last fetch was less than 30 s ago (on this clock)
        clock.now += 30
        await asyncio.gather(*(refusal(verifier, bogus[i % 3].sign(claims())) for i in range(50)))
        assert idp.fetches == 3  # 50 concurrent unknown kids shared one fetch
        # Keys removed from the JWKS stop verifying once it is fetched again.
        idp.document = jwks(NEW)
        clock.now += 30
        assert "unknown" in await refusal(verifier, SigningKey.rsa("2027").sign(claims()))
        assert "unknown" in await refusal(verifier, OLD.sign(claims()))
        await verifier.source.close()


async def test_jwks_down_cached_keys_keep_working_and_no_keys_is_a_clear_error() -> None:
    clock = Clock()
    async with serve_jwks(jwks(OLD)) as (idp, runner):
        verifier = url_verifier(idp.url, clock, jwks_cache_seconds=60)
        await verifier.source.start()
        url = idp.url
        await runner.cleanup()  # the identity provider goes down
    clock.now += 120  # the cache is stale: a refresh is tried, in the background, and fails
    assert (await verifier.verify(OLD.sign(claims()))).user == "alice"
    # An unknown kid waits for the fetch under way (it does not start another).
    assert "unknown" in await refusal(verifier, NEW.sign(claims()))
    source = verifier.source
    assert isinstance(source, UrlJwks) and source.fetches == 2
    assert (await verifier.verify(OLD.sign(claims()))).user == "alice"
    await verifier.source.close()
    cold = url_verifier(url, clock)
    await cold.source.start()  # logs a warning, does not raise: API keys still work
    message = await refusal(cold, OLD.sign(claims()))
    assert "identity provider's keys are unavailable" in message
    assert "unreachable" in message and url in message
    await cold.source.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_oversize_jwks_is_refused(chunked: bool) -> None:
    doc = jwks(OLD)
    doc["padding"] = "x" * 100_000
    async with serve_jwks(doc) as (idp, _):
        idp.chunked = chunked
        verifier = url_verifier(idp.url, Clock(), jwks_max_bytes=65_536)
        await verifier.source.start()
        message = await refusal(verifier, OLD.sign(claims()))
        assert "larger than jwt.jwks_max_bytes (65536 bytes)" in message
        await verifier.source.close()


async def test_jwks_answering_an_error_or_not_json_is_refused() -> None:
    async with serve_jwks(jwks(OLD)) as (idp, _):
        idp.status = 503
        verifier = url_verifier(idp.url, Clock(), jwks_min_refresh_seconds=0)
        await verifier.source.start()
        assert "answered HTTP 503" in await refusal(verifier, OLD.sign(claims()))
        idp.status, idp.document = 200, b"<html>sign in</html>"
        assert "is not JSON" in await refusal(verifier, OLD.sign(claims()))
        idp.document = jwks(OLD)
        assert (await verifier.verify(OLD.sign(claims()))).user == "alice"
        await verifier.source.close()


def test_unusable_keys_are_skipped_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    good = OLD.jwk()
    oct_key = {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}
    private = {**NEW.jwk(), "kid": "leaked", "d": "AAAA"}
    encryption = {**NEW.jwk(), "kid": "enc", "use": "enc"}
    broken = {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"}
    keys = parse_jwks(
        json.dumps({"keys": [oct_key, private, encryption, broken, good, 7]}).encode(), "x"
    )
    assert keys.kids == {OLD.kid}
    assert "hmac" not in keys.kids and "skipped" in caplog.text
    with pytest.raises(JwksError, match="no usable public signing key"):
        parse_jwks(json.dumps({"keys": [oct_key]}).encode(), "x")
    with pytest.raises(JwksError, match="with a 'keys' list"):
        parse_jwks(b'{"keys": {}}', "x")


async def test_jwks_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(OLD)))
    clock = Clock()
    config = JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(path))
    source = FileJwks(str(path), config.jwks_max_bytes, clock=clock)
    source.load()
    verifier = JwtVerifier(config, source, TIERS)
    assert (await verifier.verify(OLD.sign(claims()))).user == "alice"
    # Rotation: written beside and renamed over, as a secret mount or a deploy tool does.
    tmp = tmp_path / "jwks.tmp"
    tmp.write_text(json.dumps(jwks(NEW)))
    os.replace(tmp, path)
    assert (await verifier.verify(NEW.sign(claims("bob")))).user == "bob"  # unknown kid: at once
    clock.now += 1  # a known kid is checked against the file at most once a second
    assert "unknown" in await refusal(verifier, OLD.sign(claims()))
    # A broken rewrite keeps the keys read before.
    path.write_text("{not json")
    clock.now += 1
    assert (await verifier.verify(NEW.sign(claims()))).user == "alice"
    path.unlink()
    clock.now += 1
    assert (await verifier.verify(NEW.sign(claims()))).user == "alice"


def test_jwks_file_that_cannot_work_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(JwksError, match="cannot read JWKS file"):
        FileJwks(str(tmp_path / "missing.json"), 1000).load()
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**jwks(OLD), "pad": "x" * 2000}))
    with pytest.raises(JwksError, match=r"larger than jwt\.jwks_max_bytes"):
        FileJwks(str(big), 1000).load()


async def test_a_remembered_token_is_refused_once_its_key_is_gone_or_it_expires(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(OLD, NEW)))
    clock = Clock()
    config = JwtConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=str(path), leeway_seconds=0)
    source = FileJwks(str(path), config.jwks_max_bytes, clock=clock)
    source.load()
    verifier = JwtVerifier(config, source, TIERS)
    old = OLD.sign(claims())
    for _ in range(2):  # verified, then remembered
        assert (await verifier.verify(old)).user == "alice"
    path.write_text(json.dumps(jwks(NEW)))  # the provider withdraws the old key
    clock.now += 1
    assert "unknown" in await refusal(verifier, old)
    # A remembered token is good until its exp, not beyond.
    exp = int(time.time()) + 1
    new = NEW.sign(claims(exp=exp))
    for _ in range(2):
        assert (await verifier.verify(new)).user == "alice"
    # Real clock: PyJWT checks exp against the wall clock (time.time), which must pass it.
    await asyncio.sleep(exp - time.time() + 0.05)
    assert "JWT expired" in await refusal(verifier, new)


async def test_https_jwks_verified_with_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key = tls_files(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    async with serve_jwks(jwks(OLD), tls=tls) as (idp, _):
        trusted = url_verifier(idp.url, Clock(), jwks_ca_file=str(ca))
        await trusted.source.start()
        assert (await trusted.verify(OLD.sign(claims()))).user == "alice"
        await trusted.source.close()
        system_cas = url_verifier(idp.url, Clock())  # the private CA is not trusted
        await system_cas.source.start()
        assert "certificate verify failed" in await refusal(system_cas, OLD.sign(claims()))
        await system_cas.source.close()
    with pytest.raises(JwksError, match=r"jwt\.jwks_ca_file: cannot use"):
        url_verifier(idp.url, Clock(), jwks_ca_file=str(tmp_path / "missing.pem"))
