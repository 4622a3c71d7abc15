"""Hostile input: every field of every request fuzzed, and bytes that are not gRPC at all.

The promise under test: whatever a caller sends, the call ends with a normal stream or a
gRPC status whose message says what was wrong; never INTERNAL or UNKNOWN (a fault in fairq),
never a hang (each call has a deadline, and hitting it fails the test). Malformed bytes on the
wire get a status or a closed connection, and the next good request is served.
"""

from __future__ import annotations

import contextlib
import socket
import string
import struct
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2
from fairq_server.app import FairqServer
from fairq_server.config.schema import Config, RequestBounds
from fairq_sim import SimConfig, SimServer

from ..conftest import KEYS, make_config, sim_backend
from .helpers import Outcome, generate, run_call, send_raw

CALL_TIMEOUT = 15.0  # a call still running after this is a hang, and fails the test
FAULT_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
# A request without max_tokens is sent default_max_tokens: as short as the bounded ones.
LIMITS = RequestBounds(
    max_prompt_chars=2_000, max_messages=8, max_tokens=400, max_stop_chars=20, default_max_tokens=16
)
ROOT = ("authorization", "Bearer root-key")

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
async def fuzz_sim() -> AsyncIterator[SimServer]:
    """A fast simulator that takes many requests at once."""
    async with SimServer(SimConfig(model="sim", speed=50.0, max_num_seqs=64)) as sim:
        yield sim


async def _serve(config: Config) -> FairqServer:
    server = FairqServer(config)
    await server.start()
    return server


@pytest.fixture(scope="module")
async def open_server(fuzz_sim: SimServer) -> AsyncIterator[FairqServer]:
    """Open mode (no keys): x-fairq-user names the caller; small input limits."""
    server = await _serve(replace(make_config([sim_backend(fuzz_sim)]), limits=LIMITS))
    yield server
    await server.stop(grace=0.5)


@pytest.fixture(scope="module")
async def keyed_server(fuzz_sim: SimServer) -> AsyncIterator[FairqServer]:
    """API keys configured (alice: standard and batch; bob: all tiers; root: admin)."""
    config = make_config([sim_backend(fuzz_sim)], keys=list(KEYS.values()))
    server = await _serve(replace(config, limits=LIMITS))
    yield server
    await server.stop(grace=0.5)


@pytest.fixture(scope="module")
async def admin_server() -> AsyncIterator[FairqServer]:
    """A server for Admin fuzzing only (registrations there must not disturb Generate)."""
    server = await _serve(make_config(keys=list(KEYS.values())))
    yield server
    await server.stop(grace=0.5)


@pytest.fixture(scope="module")
async def channels(
    open_server: FairqServer, keyed_server: FairqServer, admin_server: FairqServer
) -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    """One channel per server, reused by every example."""
    async with contextlib.AsyncExitStack() as stack:
        out = {}
        for name, server in (("open", open_server), ("keyed", keyed_server),
                             ("admin", admin_server)):  # fmt: skip
            out[name] = await stack.enter_async_context(
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
            )
        yield out


# -- strategies ---------------------------------------------------------------------------

# Any Unicode scalar value (protobuf strings are UTF-8; surrogates cannot be encoded at all).
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
LONG_TEXT = st.text(st.characters(codec="utf-8"), min_size=1_990, max_size=2_100)
# gRPC metadata values are printable ASCII; the client refuses anything else before sending.
META_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200)
FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer", "", "robot"]) | TEXT
TIERS = st.sampled_from(["", "interactive", "standard", "batch", "platinum"]) | TEXT


# Each field has a strategy of valid values and one of anything-goes values. An example is
# wholly valid, wholly hostile, or valid but for one field: so that the success path (the
# request reaches the backend and streams) is exercised as much as each validation path.
VALID: dict[str, st.SearchStrategy[Any]] = {
    "model": st.just("sim"),
    "tier": st.sampled_from(["", "interactive", "standard", "batch"]),
    # The token alphabet of scheduler.proto; anything else is INVALID_ARGUMENT (log lines).
    "request_id": st.just("")
    | st.text(st.sampled_from(string.ascii_letters + string.digits + "-._~:/@+="), max_size=32),
    "input": st.tuples(st.just("prompt"), st.text(min_size=1, max_size=200).filter(str.strip)),
    "max_tokens": st.none() | st.integers(1, 16),
    "temperature": st.none() | st.floats(0, 2, width=32),
    "top_p": st.none() | st.floats(0, 1, exclude_min=True, width=32),
    "stop": st.lists(st.text(min_size=1, max_size=20), max_size=4),
    "seed": st.none() | st.integers(-(2**63), 2**63 - 1),
    "ignore_eos": st.booleans(),
}
HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["", "nope", "s" * 300]) | TEXT,
    "tier": TIERS,
    "request_id": TEXT | st.text(min_size=120, max_size=140),
    "input": st.tuples(st.just("prompt"), TEXT | LONG_TEXT | st.sampled_from(["", " \n\t"]))
    | st.tuples(st.just("messages"), st.lists(st.tuples(ROLES, TEXT | LONG_TEXT), max_size=10))
    | st.tuples(st.just("none"), st.none()),
    "max_tokens": st.integers(0, 2**32 - 1),
    "temperature": FLOAT32 | st.sampled_from([2.0000002, -0.0, -1e-30]),
    "top_p": FLOAT32 | st.sampled_from([0.0, 1.0000001, 1e-45]),
    "stop": st.lists(TEXT | st.text(min_size=19, max_size=22), max_size=6),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "ignore_eos": st.booleans(),
}


@st.composite
def generate_requests(draw: st.DrawFn) -> scheduler_pb2.GenerateRequest:
    mode = draw(st.sampled_from(["valid", "one-hostile", "hostile"]))
    odd = draw(st.sampled_from(sorted(VALID)))
    v: dict[str, Any] = {}  # each value is whatever its strategy draws
    for name in sorted(VALID):
        hostile = mode == "hostile" or (mode == "one-hostile" and name == odd)
        v[name] = draw((HOSTILE if hostile else VALID)[name])
    req = scheduler_pb2.GenerateRequest(
        model=str(v["model"]), tier=str(v["tier"]), request_id=str(v["request_id"])
    )
    which, content = v["input"]
    if which == "prompt":
        req.prompt = content
    elif which == "messages":
        req.messages.SetInParent()  # an empty list is still "messages", not "no input"
        for role, text in content:
            req.messages.messages.add(role=role, content=text)
    s = req.sampling
    for name in ("max_tokens", "temperature", "top_p", "seed"):
        if v[name] is not None:
            setattr(s, name, v[name])
    s.stop.extend(v["stop"])
    s.ignore_eos = bool(v["ignore_eos"])
    return req


AUTH = (
    st.sampled_from(["Bearer alice-key", "Bearer bob-key", "Bearer root-key"])
    | st.sampled_from(
        [
            None,
            "Bearer alice-key",
            "Bearer bob-key",
            "Bearer root-key",
            "Bearer nope",
            "bearer   bob-key  ",
            "Basic alice-key",
            "Bearer",
            "",
        ]
    )
    | META_VALUE.map(lambda v: f"Bearer {v}")
)


@st.composite
def metadata(draw: st.DrawFn) -> tuple[tuple[str, str], ...]:
    md: list[tuple[str, str]] = []
    if draw(st.booleans()):
        md.append(("x-fairq-user", draw(META_VALUE | st.sampled_from(["", "u" * 129]))))
    auth = draw(AUTH)
    if auth is not None:
        md.append(("authorization", auth))
    key = st.text(
        st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=20
    )
    extra = draw(st.lists(st.tuples(key, META_VALUE), max_size=3))
    md.extend((k, v) for k, v in extra if not k.startswith("grpc") and not k.endswith("-bin"))
    return tuple(md)


def check(out: Outcome, what: object) -> None:
    """A normal, complete stream, or an explanatory status that is not a fault in fairq."""
    event(out.code.name)  # shown by --hypothesis-show-statistics: are both paths exercised?
    if out.code is grpc.StatusCode.OK:
        assert out.kinds[0] == "queued" and out.kinds[-1] == "finished", (out, what)
        assert out.kinds.count("finished") == 1 and "started" in out.kinds, (out, what)
        return
    assert out.code is not grpc.StatusCode.DEADLINE_EXCEEDED, f"hang: {out} for {what}"
    assert out.code not in FAULT_CODES, (out, what)
    assert out.details.strip(), (out, what)


# -- Generate -----------------------------------------------------------------------------


@FUZZ
@given(request=generate_requests(), md=metadata())
async def test_generate_fuzz_open_mode(
    channels: dict[str, grpc.aio.Channel],
    request: scheduler_pb2.GenerateRequest,
    md: tuple[tuple[str, str], ...],
) -> None:
    out = await run_call(generate(channels["open"], request, metadata=md, timeout=CALL_TIMEOUT))
    check(out, (request, md))


@FUZZ
@given(request=generate_requests(), md=metadata())
async def test_generate_fuzz_with_api_keys(
    channels: dict[str, grpc.aio.Channel],
    request: scheduler_pb2.GenerateRequest,
    md: tuple[tuple[str, str], ...],
) -> None:
    out = await run_call(generate(channels["keyed"], request, metadata=md, timeout=CALL_TIMEOUT))
    check(out, (request, md))
    if out.code is grpc.StatusCode.OK:
        assert any(k == "authorization" for k, _ in md)


# -- Admin --------------------------------------------------------------------------------

# URL shapes that once passed fairq's own checks and made urllib or httpx raise a foreign
# exception, which escaped RegisterBackend as UNKNOWN. They are in the fuzzer's alphabet below
# as well, and pinned down one by one in a test of their own.
UNUSABLE_URLS = [
    "http://[::1",  # urlsplit: ValueError Invalid IPv6 URL
    "http://127.0.0.1:abc",  # httpx.InvalidURL: Invalid port
    "http://127.0.0.1:99999",  # first scrape: ExceptionGroup (port out of range)
    "http://127.0.0.1:-1",  # likewise
    "http://127.0.0.1:1/\x01",  # httpx.InvalidURL: non-printable character
]


URLS = (
    st.sampled_from(
        [
            "",
            "http://127.0.0.1:1",
            "http://localhost:1",
            "http://[::1]:1",
            "https://127.0.0.1:1",
            "http://127.0.0.1:1/v1?x=1",
            "http://u:p@127.0.0.1:1",
            "http://127.0.0.1:1#frag",
            "ftp://127.0.0.1:1",
            "http://169.254.169.254",
            "http://8.8.8.8:1",
            "http://%31%32%37.0.0.1:1",
            "http:///nohost",
            "127.0.0.1:1",
            *UNUSABLE_URLS,
        ]
    )
    | st.builds(lambda s: f"http://127.0.0.1:1/{s}", TEXT)
    | st.builds(lambda s: f"http://{s}:1", TEXT)
    | TEXT
)

ADMIN_VALID: dict[str, st.SearchStrategy[Any]] = {
    "id": st.sampled_from(["b", "gpu-1"]),
    "kind": st.sampled_from([admin_pb2.BACKEND_KIND_VLLM, admin_pb2.BACKEND_KIND_TGI]),
    "base_url": st.sampled_from(["http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1"]),
    "models": st.lists(st.sampled_from(["m", "n"]), min_size=1, max_size=2),
}
ADMIN_HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "id": st.just("") | TEXT | st.text(min_size=128, max_size=130),
    "kind": st.integers(-2, 4),
    "base_url": URLS,
    "models": st.lists(st.sampled_from(["m", ""]) | TEXT, max_size=3),
}


@st.composite
def backends(draw: st.DrawFn) -> admin_pb2.Backend:
    """Wholly valid, wholly hostile, or valid but for one field (as for Generate)."""
    mode = draw(st.sampled_from(["valid", "one-hostile", "hostile"]))
    odd = draw(st.sampled_from(sorted(ADMIN_VALID)))
    v: dict[str, Any] = {
        name: draw(
            (ADMIN_HOSTILE if mode == "hostile" or (mode == "one-hostile" and name == odd)
             else ADMIN_VALID)[name]
        )
        for name in sorted(ADMIN_VALID)
    }  # fmt: skip
    return admin_pb2.Backend(
        id=v["id"],
        kind=v["kind"],
        base_url=v["base_url"],
        models=v["models"],
        priority_scheduling=draw(st.booleans()),
        max_in_flight=draw(st.integers(0, 2**32 - 1)),
    )


async def _unary(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def check_unary(code: grpc.StatusCode, details: str, what: object) -> None:
    event(code.name)
    assert code is not grpc.StatusCode.DEADLINE_EXCEEDED, f"hang for {what}"
    assert code not in FAULT_CODES, (code, details, what)
    if code is not grpc.StatusCode.OK:
        assert details.strip(), (code, what)


@FUZZ
@given(
    backend=backends(),
    as_root=st.sampled_from([True, True, True, False]),
    drain=st.booleans(),
    other_id=TEXT,
)
async def test_admin_fuzz(
    channels: dict[str, grpc.aio.Channel],
    admin_server: FairqServer,
    backend: admin_pb2.Backend,
    as_root: bool,
    drain: bool,
    other_id: str,
) -> None:
    admin = admin_pb2_grpc.AdminStub(channels["admin"])
    md = (ROOT,) if as_root else (("authorization", "Bearer alice-key"),)
    request = admin_pb2.RegisterBackendRequest(backend=backend)
    code, details = await _unary(admin.RegisterBackend(request, metadata=md, timeout=CALL_TIMEOUT))
    check_unary(code, details, backend)
    if not as_root:
        assert code is grpc.StatusCode.PERMISSION_DENIED
    listed = await _unary(admin.ListBackends(admin_pb2.ListBackendsRequest(), metadata=md,
                                             timeout=CALL_TIMEOUT))  # fmt: skip
    check_unary(*listed, "list")
    for backend_id in (other_id, backend.id):
        dereg = admin_pb2.DeregisterBackendRequest(id=backend_id, drain=drain)
        code, details = await _unary(
            admin.DeregisterBackend(dereg, metadata=md, timeout=CALL_TIMEOUT)
        )
        check_unary(code, details, ("deregister", backend_id))
    # Whatever happened, nothing registered is left behind to poll dead addresses.
    assert admin_server.core.backends() == []


@pytest.mark.parametrize("url", UNUSABLE_URLS)
async def test_register_backend_with_unusable_url_is_invalid_argument(
    url: str, channels: dict[str, grpc.aio.Channel], admin_server: FairqServer
) -> None:
    admin = admin_pb2_grpc.AdminStub(channels["admin"])
    backend = admin_pb2.Backend(
        id="b", kind=admin_pb2.BACKEND_KIND_VLLM, base_url=url, models=["m"]
    )
    request = admin_pb2.RegisterBackendRequest(backend=backend)
    code, details = await _unary(
        admin.RegisterBackend(request, metadata=(ROOT,), timeout=CALL_TIMEOUT)
    )
    assert admin_server.core.backends() == []
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)


# -- bytes that are not a valid request ---------------------------------------------------


async def _good_request_is_served(channel: grpc.aio.Channel) -> None:
    out = await run_call(
        generate(
            channel,
            scheduler_pb2.GenerateRequest(
                model="sim", prompt="still there?",
                sampling=scheduler_pb2.SamplingParams(max_tokens=2),
            ),
            timeout=CALL_TIMEOUT,
        )
    )  # fmt: skip
    assert out.code is grpc.StatusCode.OK and out.finished is not None, out


@FUZZ
@given(payload=st.binary(max_size=300))
async def test_invalid_protobuf_bytes_get_a_status_and_the_server_keeps_serving(
    channels: dict[str, grpc.aio.Channel], payload: bytes
) -> None:
    """A well-framed gRPC message whose payload is arbitrary bytes (identity serializers)."""
    channel = channels["open"]
    # No serializers: the payload bytes go on the wire as they are.
    method: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
        "/fairq.v1.Scheduler/Generate"
    )
    call = method(payload, timeout=CALL_TIMEOUT)
    code, details, responses = grpc.StatusCode.OK, "", 0
    try:
        async for _ in call:
            responses += 1
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
    assert code is not grpc.StatusCode.DEADLINE_EXCEEDED, payload
    try:
        scheduler_pb2.GenerateRequest.FromString(payload)
        parses = True
    except Exception:  # protobuf's DecodeError and friends: the bytes are not a request
        parses = False
    event(f"{'parses' if parses else 'garbage'}: {code.name}")
    if parses:
        # A valid encoding of some request: held to the same rules as the field fuzzing.
        assert code not in FAULT_CODES, (code, details, payload)
    else:
        assert code is not grpc.StatusCode.OK, payload
    assert code is grpc.StatusCode.OK or details.strip(), (code, payload)


async def test_oversized_message_is_refused_and_server_keeps_serving(
    channels: dict[str, grpc.aio.Channel],
) -> None:
    channel = channels["open"]
    big = scheduler_pb2.GenerateRequest(model="sim", prompt="x" * (9 * 1024 * 1024))
    out = await run_call(generate(channel, big, timeout=CALL_TIMEOUT))
    assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out
    await _good_request_is_served(channel)


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


WIRE_GARBAGE = {
    "random-bytes": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),
    "http1-request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "preface-then-junk": PREFACE + b"\xff" * 64,
    "bad-frame-length": PREFACE + b"\xff\xff\xff\x04\x00\x00\x00\x00\x00",
    "settings-on-stream": PREFACE + _frame(0x4, 0, 1, b""),
    "headers-garbage-hpack": PREFACE + _frame(0x4, 0, 0, b"") + _frame(0x1, 0x5, 1, b"\xff" * 32),
    "data-on-idle-stream": PREFACE + _frame(0x4, 0, 0, b"") + _frame(0x0, 0x1, 7, b"\x00" * 9),
    "window-update-zero": PREFACE + _frame(0x4, 0, 0, b"") + _frame(0x8, 0, 0, b"\x00" * 4),
    "huge-settings": PREFACE + _frame(0x4, 0, 0, b"\x00\x04\xff\xff\xff\xff" * 1000),
}


@pytest.mark.parametrize("case", sorted(WIRE_GARBAGE))
async def test_wire_garbage_is_answered_or_dropped_and_server_keeps_serving(
    case: str, open_server: FairqServer, channels: dict[str, grpc.aio.Channel]
) -> None:
    answer = await send_raw(open_server.port, WIRE_GARBAGE[case])
    if answer:
        # Either an HTTP/2 frame (SETTINGS or GOAWAY) or nothing: never a hang or a crash.
        assert len(answer) >= 9
    await _good_request_is_served(channels["open"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(min_size=1, max_size=200), preface=st.booleans())
async def test_random_wire_bytes_never_stop_the_server(
    open_server: FairqServer, channels: dict[str, grpc.aio.Channel], data: bytes, preface: bool
) -> None:
    assume(not data.startswith(PREFACE))
    await send_raw(open_server.port, (PREFACE if preface else b"") + data, window=0.2)
    await _good_request_is_served(channels["open"])


async def test_many_half_open_connections_do_not_block_good_requests(
    open_server: FairqServer, channels: dict[str, grpc.aio.Channel]
) -> None:
    """Connections that send a partial preface and then nothing (slowloris) do not stop the
    server from serving others."""
    socks = []
    try:
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", open_server.port))
            s.setblocking(False)
            s.send(PREFACE[:10])
            socks.append(s)
        await _good_request_is_served(channels["open"])
    finally:
        for s in socks:
            s.close()
