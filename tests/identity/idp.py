"""A test identity provider: RSA and EC signing keys, tokens, and a JWKS served over loopback."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

ISSUER = "https://sso.example.test/realms/ml"
AUDIENCE = "fairq"
TIERS = ("interactive", "standard", "batch")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey

    @classmethod
    def rsa(cls, kid: str) -> SigningKey:
        return cls(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @classmethod
    def ec(cls, kid: str) -> SigningKey:
        return cls(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))

    def jwk(self) -> dict[str, Any]:
        algorithm = jwt.algorithms.get_default_algorithms()[self.alg]
        doc: dict[str, Any] = algorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**doc, "kid": self.kid, "use": "sig", "alg": self.alg}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(
            claims, self.private, algorithm=self.alg, headers={"kid": self.kid, **header}
        )


def claims(user: str = "alice", **extra: Any) -> dict[str, Any]:
    """Claims of a valid token (issued now, expiring in five minutes)."""
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": user, "iat": now, "exp": now + 300, **extra}


def unsigned(claims: dict[str, Any], kid: str) -> str:
    """An ``alg: none`` token (empty signature)."""
    header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
    return f"{header}.{_b64(json.dumps(claims).encode())}."


def hs256_with_public_key(claims: dict[str, Any], key: SigningKey) -> str:
    """A token HMAC-signed with ``key``'s public key as the secret (the algorithm confusion)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    signing_input = f"{header}.{_b64(json.dumps(claims).encode())}"
    mac = hmac.new(key.public_pem(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(mac)}"


def jwks(*keys: SigningKey) -> dict[str, Any]:
    return {"keys": [k.jwk() for k in keys]}


@dataclass
class JwksServer:
    """A JWKS endpoint on 127.0.0.1: the document is swapped by the test, fetches counted."""

    document: Any = field(default_factory=dict)
    status: int = 200
    chunked: bool = False
    fetches: int = 0
    port: int = 0
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/certs"

    async def _certs(self, request: web.Request) -> web.StreamResponse:
        self.fetches += 1
        body = self.document if isinstance(self.document, bytes) else json.dumps(self.document)
        data = body.encode() if isinstance(body, str) else body
        if not self.chunked:
            return web.Response(status=self.status, body=data, content_type="application/json")
        resp = web.StreamResponse(status=self.status)  # no content-length: read to the end
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(data), 4096):
            await resp.write(data[i : i + 4096])
        await resp.write_eof()
        return resp


@asynccontextmanager
async def serve_jwks(
    document: Any, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[JwksServer, web.AppRunner]]:
    server = JwksServer(document, scheme="https" if tls else "http")
    app = web.Application()
    app.router.add_get("/certs", server._certs)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server, runner
    finally:
        await runner.cleanup()


def tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key) PEM files."""
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("test IdP CA"))
        .issuer_name(name("test IdP CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = (directory / "ca.pem", directory / "server.pem", directory / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths
