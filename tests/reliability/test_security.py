"""The security features under hostile input: TLS and mTLS on a ``fairq serve`` child,
disguised addresses against the backend allow-list, the queue time-to-live, and the
metadata size limit (configured in TOML, see docs/operations.md)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq.v1.scheduler_pb2 import GenerateResponse
from fairq_bench.load import ChildProcess, start_fairq
from fairq_server.app import FairqServer
from fairq_server.config.schema import BackendConfig, RequestBounds
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .helpers import (
    VLLM_IDLE_METRICS,
    GenerateCall,
    Outcome,
    ScriptedBackend,
    gen_request,
    generate,
    metric_sum,
    parse_metrics,
    raw_reply,
    run_call,
    send_raw,
    sim_requests_seen,
    until,
)

OK = grpc.StatusCode.OK

# -- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """PEM files: a CA, a server certificate for 127.0.0.1, and client certificates."""

    ca: Path
    server_crt: Path
    server_key: Path
    client: tuple[bytes, bytes]  # (key, chain), issued by ``ca``
    expired: tuple[bytes, bytes]  # issued by ``ca``, validity ended yesterday
    foreign: tuple[bytes, bytes]  # issued by another CA


def _issue(
    subject: str,
    issuer: tuple[ec.EllipticCurvePrivateKey, x509.Name] | None,
    *,
    ca: bool = False,
    expired: bool = False,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    signer, issuer_name = issuer if issuer is not None else (key, name)
    now = datetime.datetime.now(datetime.UTC)
    start, end = (
        (now - datetime.timedelta(days=2), now - datetime.timedelta(days=1))
        if (expired)
        else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(hours=2))
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, builder.sign(signer, hashes.SHA256())


def _pem(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[bytes, bytes]:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("reliability-pki")
    ca_key, ca = _issue("fairq reliability CA", None, ca=True)
    issuer = (ca_key, ca.subject)
    server = _pem(*_issue("127.0.0.1", issuer))
    rogue_key, rogue = _issue("rogue CA", None, ca=True)
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "server.key").write_bytes(server[0])
    (d / "server.crt").write_bytes(server[1])
    return Pki(
        ca=d / "ca.pem",
        server_crt=d / "server.crt",
        server_key=d / "server.key",
        client=_pem(*_issue("client", issuer)),
        expired=_pem(*_issue("client", issuer, expired=True)),
        foreign=_pem(*_issue("client", (rogue_key, rogue.subject))),
    )


def _tls_config(sim: SimServer, pki: Pki, *, mutual: bool) -> str:
    client_ca = f'client_ca_file = "{pki.ca}"\n' if mutual else ""
    return (
        'listen = "127.0.0.1:0"\n'
        f'[tls]\ncert_file = "{pki.server_crt}"\nkey_file = "{pki.server_key}"\n{client_ca}'
        "[[backends]]\n"
        f'id = "sim-a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
    )


def _credentials(pki: Pki, client: tuple[bytes, bytes] | None) -> grpc.ChannelCredentials:
    key, chain = client if client is not None else (None, None)
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(), private_key=key, certificate_chain=chain
    )


async def _generate_over(target: str, credentials: grpc.ChannelCredentials | None) -> Outcome:
    channel = (
        grpc.aio.secure_channel(target, credentials)
        if credentials is not None
        else grpc.aio.insecure_channel(target)
    )
    async with channel:
        return await run_call(generate(channel, gen_request(max_tokens=3), timeout=10))


@pytest.fixture
async def fast_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(model="sim", speed=20.0, max_num_seqs=8)) as sim:
        yield sim


async def first_chunk(call: GenerateCall, out: Outcome) -> None:
    """Read ``call`` up to its first chunk into ``out``."""
    while out.chunks == 0:
        response = await call.read()
        assert isinstance(response, GenerateResponse), out
        kind = response.WhichOneof("event")
        assert kind is not None
        out.kinds.append(kind)


async def _alive(child: ChildProcess) -> bool:
    return child.proc.returncode is None


# -- TLS ------------------------------------------------------------------------------------

# Bytes a port scanner, a confused client or an attacker might send to a TLS port.
TLS_PORT_GARBAGE = {
    "plaintext-http2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 9,
    "http1": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "truncated-client-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 20,
    "tls-record-garbage": b"\x16\x03\x03\xff\xff" + bytes(range(256)) * 4,
    "alert-then-junk": b"\x15\x03\x03\x00\x02\x02\x28" + b"junk" * 100,
}


async def test_tls_child_serves_tls_and_shrugs_off_plaintext_and_garbage(
    fast_sim: SimServer, pki: Pki
) -> None:
    """`fairq serve` with [tls]: a verifying TLS client is served; a plaintext gRPC client
    and raw garbage get nothing (connection closed), and the next TLS client is served."""
    fairq = await start_fairq(_tls_config(fast_sim, pki, mutual=False))
    try:
        port = int(fairq.address.rsplit(":", 1)[1])
        first = await _generate_over(fairq.address, _credentials(pki, None))
        plain = await _generate_over(fairq.address, None)
        answers = {name: await send_raw(port, data) for name, data in TLS_PORT_GARBAGE.items()}
        after = await _generate_over(fairq.address, _credentials(pki, None))
        alive = await _alive(fairq)
    finally:
        await fairq.stop()
    assert first.code is OK and first.finished is not None, first
    assert plain.code == grpc.StatusCode.UNAVAILABLE, plain
    for name, answer in answers.items():
        # Nothing readable leaks back: at most a TLS alert record (content type 21).
        assert not answer or answer[0] == 0x15, (name, answer[:40])
    assert after.code is OK and after.finished is not None, after
    assert alive


@pytest.mark.parametrize("who", ["none", "foreign-ca", "expired"])
async def test_mutual_tls_child_refuses_clients_without_a_valid_certificate(
    who: str, fast_sim: SimServer, pki: Pki
) -> None:
    """With client_ca_file, only a current certificate from that CA gets in; the refused
    handshakes leave the server serving."""
    client = {"none": None, "foreign-ca": pki.foreign, "expired": pki.expired}[who]
    fairq = await start_fairq(_tls_config(fast_sim, pki, mutual=True))
    try:
        refused = await _generate_over(fairq.address, _credentials(pki, client))
        admitted = await _generate_over(fairq.address, _credentials(pki, pki.client))
    finally:
        await fairq.stop()
    assert refused.code == grpc.StatusCode.UNAVAILABLE, refused
    assert refused.kinds == []  # not one event: the handshake failed
    assert admitted.code is OK and admitted.finished is not None, admitted


# -- the backend allow-list -------------------------------------------------------------------

# Every way to spell a forbidden address we could think of; the default allow-list holds
# loopback and private networks only.
DISGUISED = [
    "http://169.254.169.254",
    "http://169.254.169.254:80/latest/meta-data",
    "http://[::ffff:169.254.169.254]",
    "http://[::ffff:a9fe:a9fe]:80",
    "http://2852039166",
    "http://0xa9fea9fe",
    "http://0251.0376.0251.0376",
    "http://169.254.169.254.nip.io",
    "http://169\u3002254\u3002169\u3002254",
    "http://metadata.google.internal",
    "http://0.0.0.0:8000",
    "http://[::]:8000",
    "http://[fe80::1%25eth0]:8000",
    "http://8.8.8.8",
    "http://[2001:4860:4860::8888]",
    "http://127.0.0.1.evil.example",
    "http://localhost.evil.example",
    "http://localhost@169.254.169.254",
    "http://169.254.169.254#@localhost",
    "http://169.254.169.254?@localhost",
    "http://127.0.0.1:80\\@169.254.169.254",
    "http://127.1",
    "http://[::ffff:127.0.0.1]",
]
SPELLED_ALLOWED = [
    "http://LOCALHOST:1",
    "http://localhost.:1",
    "http://127.0.0.2:1",
    "http://[::1]:1",
]


async def _register(port: int, url: str) -> admin_pb2.RegisterBackendResponse:
    """Register backend ``b`` (vLLM, model ``m``) at ``url`` through the Admin API."""
    backend = admin_pb2.Backend(
        id="b", kind=admin_pb2.BACKEND_KIND_VLLM, base_url=url, models=["m"]
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await admin_pb2_grpc.AdminStub(channel).RegisterBackend(
            admin_pb2.RegisterBackendRequest(backend=backend), timeout=10
        )


@pytest.mark.parametrize("url", DISGUISED)
async def test_allow_list_refuses_disguised_addresses(
    url: str, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _register(server.port, url)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    details = info.value.details() or ""
    assert "allow-list" in details or "credentials, query or fragment" in details, details
    assert server.core.backends() == []


@pytest.mark.parametrize("url", SPELLED_ALLOWED)
async def test_allow_list_admits_loopback_however_spelled(
    url: str, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config())
    reply = await _register(server.port, url)
    assert not reply.status.healthy  # allowed; nothing listens on port 1
    assert [e.backend.id for e in server.core.backends()] == ["b"]


# -- queue time-to-live ------------------------------------------------------------------------


async def test_queue_ttl_on_a_child_expires_queued_work_and_never_dispatches_it() -> None:
    """`fairq serve` with queue_ttl_seconds = 0.5: a request queued behind a full backend,
    with no deadline of its own, is answered DEADLINE_EXCEEDED soon after 0.5 s and never
    reaches the backend; the running request, older than the TTL, is not touched."""
    async with SimServer(SimConfig(model="sim", speed=0.1, max_num_seqs=4)) as sim:
        config = (
            'listen = "127.0.0.1:0"\n[scheduler]\nqueue_ttl_seconds = 0.5\n'
            "poll_interval_seconds = 0.05\n[[backends]]\n"
            f'id = "sim-a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
            "max_in_flight = 1\n"
        )
        fairq = await start_fairq(config, metrics=True)
        try:
            async with grpc.aio.insecure_channel(fairq.address) as ch:
                a, b = (("x-fairq-user", "a"),), (("x-fairq-user", "b"),)
                running = generate(ch, gen_request(max_tokens=120), metadata=a)
                running_out = Outcome()
                await first_chunk(running, running_out)  # it holds the only backend slot
                queued = await run_call(generate(ch, gen_request(prompt="late"), metadata=b))
                done = await run_call(running, running_out)
            async with httpx.AsyncClient() as http:
                samples = parse_metrics((await http.get(fairq.metrics_url)).text)
        finally:
            await fairq.stop()
        seen = await sim_requests_seen(sim)
    assert queued.code == grpc.StatusCode.DEADLINE_EXCEEDED, queued
    assert "waited in the queue longer than 0.5 s" in queued.details
    assert queued.kinds == ["queued"]
    assert done.code is OK and done.finished is not None, done  # ran ~1.3 s, past the TTL
    assert seen == 1
    assert metric_sum(samples, "fairq_queue_depth") == 0
    assert metric_sum(samples, "fairq_requests_total", outcome="deadline_exceeded") == 1


async def test_queue_ttl_applies_to_a_request_requeued_for_retry() -> None:
    """A request that failed before its first token and went back to the queue is still a
    queued request: once older than the TTL it gets DEADLINE_EXCEEDED, not an endless wait."""
    release = asyncio.Event()

    async def reply(body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        await release.wait()
        await raw_reply(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n"
            b"connection: close\r\n\r\nbusy"
        )(body, writer)

    async with ScriptedBackend(reply) as backend:
        config = make_config(
            [BackendConfig("scripted", "vllm", backend.url, ("m",))], queue_ttl_seconds=0.3
        )
        server = FairqServer(config)
        await server.start()
        entry = server.core.backend("scripted")
        assert entry is not None
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                call = generate(ch, gen_request(model="m"), metadata=(("x-fairq-user", "a"),))
                await until(lambda: len(backend.requests) == 1, what="request at the backend")
                # The backend now reports a long queue, so the gate will hold the retry.
                backend.metrics = VLLM_IDLE_METRICS.replace(
                    'waiting{model_name="x"} 0.0', 'waiting{model_name="x"} 50.0'
                )
                await until(
                    lambda: entry.sample is not None and entry.sample.waiting == 50,
                    what="busy backend seen",
                )
                # Real clock: a live server ages the running request past the TTL.
                await asyncio.sleep(0.4)
                release.set()
                out = Outcome()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):  # ten TTLs
                        await run_call(call, out)
        finally:
            await server.stop(grace=0.5)
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED, f"after 5 s: {out}"
    assert "waited in the queue" in out.details


# -- metadata size ---------------------------------------------------------------------------


async def test_metadata_limit_from_toml_refuses_big_headers_and_keeps_serving(
    fast_sim: SimServer,
) -> None:
    """`[limits] max_metadata_bytes = 4096` on a child: metadata far over it (one big value,
    or many small entries) is refused RESOURCE_EXHAUSTED, a flood of it does no harm, and
    metadata within the limit is served."""
    config = (
        'listen = "127.0.0.1:0"\n[limits]\nmax_metadata_bytes = 4096\n[[backends]]\n'
        f'id = "sim-a"\nkind = "vllm"\nbase_url = "{fast_sim.url}"\nmodels = ["sim"]\n'
    )
    fairq = await start_fairq(config)
    try:
        async with grpc.aio.insecure_channel(fairq.address) as ch:

            async def with_metadata(md: tuple[tuple[str, str], ...]) -> Outcome:
                call = generate(ch, gen_request(max_tokens=2), metadata=md, timeout=10)
                return await run_call(call)

            one_big = await with_metadata((("x-pad", "a" * 40_000),))
            many = await with_metadata(tuple((f"x-pad-{i}", "b" * 200) for i in range(200)))
            flood = await asyncio.gather(
                *(with_metadata((("x-pad", "c" * 100_000),)) for _ in range(100))
            )
            small = await with_metadata((("x-pad", "d" * 2_000), ("x-fairq-user", "u")))
        alive = await _alive(fairq)
    finally:
        await fairq.stop()
    for out in (one_big, many, *flood):
        assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out
        assert "metadata size exceeds" in out.details
    assert small.code is OK and small.finished is not None, small
    assert alive


@pytest.mark.parametrize(("limit", "size"), [(16_384, 17_000), (4_096, 8_000)])
async def test_metadata_over_the_limit_is_always_refused(
    limit: int, size: int, fast_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """max_metadata_bytes is a limit: metadata over it is refused every time, not now and
    then (17 KB against the default 16 KiB; 8 KB against a configured 4 KiB)."""
    config = make_config([sim_backend(fast_sim)])
    server = await fairq_factory(replace(config, limits=RequestBounds(max_metadata_bytes=limit)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        outs = [
            await run_call(generate(ch, gen_request(max_tokens=1),
                                    metadata=(("x-pad", "a" * size),), timeout=10))
            for _ in range(20)
        ]  # fmt: skip
    served = [o for o in outs if o.code is OK]
    assert not served, f"{len(served)} of 20 requests over the limit were served"
