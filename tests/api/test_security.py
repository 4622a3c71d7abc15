"""TLS and mutual TLS with certificates made in the test; allow-list; queue TTL; metadata cap."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import AdminConfig, TlsConfig
from fairq_sim import SimServer

from ..conftest import FairqFactory, freeze_gate, make_config, sim_backend

GEN = scheduler_pb2.GenerateRequest(
    model="sim", prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    subject: str, issuer_key: ec.EllipticCurvePrivateKey | None, issuer: str, *, ca: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return key, cert


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca = _issue("fairq test CA", None, "fairq test CA", ca=True)
    srv_key, srv = _issue("127.0.0.1", ca_key, "fairq test CA", ca=False)
    cli_key, cli = _issue("client-alice", ca_key, "fairq test CA", ca=False)
    files = {
        "ca": ca.public_bytes(serialization.Encoding.PEM),
        "server.crt": srv.public_bytes(serialization.Encoding.PEM),
        "server.key": _pem(srv_key),
        "client.crt": cli.public_bytes(serialization.Encoding.PEM),
        "client.key": _pem(cli_key),
    }
    paths = {}
    for name, data in files.items():
        (d / name).write_bytes(data)
        paths[name] = d / name
    return paths


async def _generate(channel: grpc.aio.Channel) -> list[scheduler_pb2.GenerateResponse]:
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    return [r async for r in stub.Generate(GEN, timeout=10)]


async def test_tls_serves_verified_clients_and_refuses_plaintext(
    sim: SimServer, fairq_factory: FairqFactory, pki: dict[str, Path]
) -> None:
    tls = TlsConfig(str(pki["server.crt"]), str(pki["server.key"]))
    server = await fairq_factory(replace(make_config([sim_backend(sim)]), tls=tls))
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", creds) as channel:
        events = await _generate(channel)
    assert events[-1].finished.usage.completion_tokens == 4
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _generate(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate(
    sim: SimServer, fairq_factory: FairqFactory, pki: dict[str, Path]
) -> None:
    tls = TlsConfig(str(pki["server.crt"]), str(pki["server.key"]), str(pki["ca"]))
    server = await fairq_factory(replace(make_config([sim_backend(sim)]), tls=tls))
    target = f"127.0.0.1:{server.port}"
    anonymous = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
    async with grpc.aio.secure_channel(target, anonymous) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _generate(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with_cert = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki["client.key"].read_bytes(),
        certificate_chain=pki["client.crt"].read_bytes(),
    )
    async with grpc.aio.secure_channel(target, with_cert) as channel:
        events = await _generate(channel)
    assert events[-1].WhichOneof("event") == "finished"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://8.8.8.8:80", False),
        ("http://metadata.google.internal", False),
        ("http://169.254.169.254/", False),
        ("http://gpu-1.internal:8000", True),
        ("http://10.1.2.3:8000", True),
    ],
)
async def test_register_backend_allow_list(
    fairq_factory: FairqFactory, url: str, allowed: bool
) -> None:
    config = replace(
        make_config(), admin=AdminConfig(backend_allowlist=("gpu-1.internal", "10.0.0.0/8"))
    )
    server = await fairq_factory(config)
    backend = admin_pb2.Backend(
        id="b", kind=admin_pb2.BACKEND_KIND_VLLM, base_url=url, models=["m"]
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        call = admin.RegisterBackend(admin_pb2.RegisterBackendRequest(backend=backend), timeout=20)
        if allowed:
            # The host is allowed; nothing listens there, so the backend is just unhealthy.
            status = await call
            assert status.status.backend.base_url == url.rstrip("/")
        else:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not in the allow-list" in (info.value.details() or "")


async def test_queue_ttl_answers_deadline_exceeded(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], queue_ttl_seconds=0.3))
    await freeze_gate(server)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        call = stub.Generate(GEN, timeout=10)
        assert (await call.read()).WhichOneof("event") == "queued"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "waited in the queue longer than 0.3 s" in (info.value.details() or "")
    assert len(server.core.dispatcher.queue("sim")) == 0
    assert entry_dispatches(server) == 0


async def test_oversized_metadata_is_refused_and_server_keeps_serving(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [r async for r in stub.Generate(GEN, metadata=(("x-pad", "a" * 40_000),), timeout=10)]
        assert info.value.code() in (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.UNAVAILABLE,
        )
        assert entry_dispatches(server) == 0
        events = [r async for r in stub.Generate(GEN, timeout=10)]
    assert events[-1].WhichOneof("event") == "finished"


def entry_dispatches(server: object) -> int:
    entry = server.core.backend("sim-a")  # type: ignore[attr-defined]
    return int(entry.dispatched)
