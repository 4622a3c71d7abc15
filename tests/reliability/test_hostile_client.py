"""A hostile or careless caller: hand-built protobuf bytes, raw HTTP/2 frames, names built to
break logs and status messages, a registration abandoned mid-way, generic gRPC tooling."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from dataclasses import replace

import aiohttp
import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_bench.hostile_backend import HostileBackend
from fairq_server.app import FairqServer
from fairq_server.config.schema import RequestBounds
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, make_config, sim_backend
from .helpers import gen_request, generate, run_call, until

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _target(server: FairqServer) -> str:
    return f"127.0.0.1:{server.port}"


# -- item 5: bytes that are not the request message ---------------------------------------

CORRUPT = {
    "bad-utf8-string": b"\x0a\x02\xff\xfe",  # field 1 (a string) holding invalid UTF-8
    "length-past-end": b"\x0a\x7fabc",  # a field claiming 127 bytes, 3 present
    "bad-wire-type": b"\x0f\x00",  # wire type 7 does not exist
    "truncated-varint": b"\x08\xff\xff\xff",
}
METHODS = {
    "Generate": ("/fairq.v1.Scheduler/Generate", True),
    "RegisterBackend": ("/fairq.v1.Admin/RegisterBackend", False),
    "Health.Check": ("/grpc.health.v1.Health/Check", False),
}


async def _raw_call(channel: grpc.aio.Channel, path: str, streaming: bool, data: bytes) -> None:
    """Send ``data`` as the request of ``path`` as it is; read the answer to its end."""
    if streaming:
        call = channel.unary_stream(path)(data, timeout=10)
        async for _ in call:
            pass
    else:
        await channel.unary_unary(path)(data, timeout=10)


@pytest.mark.parametrize("method", sorted(METHODS))
async def test_undecodable_request_bytes_are_invalid_argument_with_one_log_line(
    method: str, sim: SimServer, fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Before authentication: INVALID_ARGUMENT with a short message naming the method (was
    UNKNOWN with protobuf's exception text and an ERROR traceback per call); 20 such calls
    leave at most one warning in the log, and the server goes on serving."""
    server = await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    path, streaming = METHODS[method]
    caplog.set_level(logging.INFO)
    codes: list[tuple[grpc.StatusCode, str]] = []
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        for i in range(20):
            data = CORRUPT[sorted(CORRUPT)[i % len(CORRUPT)]]
            try:
                await _raw_call(ch, path, streaming, data)
                codes.append((grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as exc:
                codes.append((exc.code(), exc.details() or ""))
        good = await run_call(
            generate(ch, gen_request(max_tokens=2), metadata=(("authorization", "Bearer bob-key"),))
        )
    name = path.rpartition("/")[2]
    assert codes == [(INVALID, f"request is not a valid {name} request message")] * 20
    assert good.code == grpc.StatusCode.OK, good
    warnings = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# -- item 10: streams that never deliver their request -------------------------------------


class H2Peer:
    """A raw HTTP/2 client on one TCP connection: sends frames, collects what comes back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.status: dict[int, str] = {}  # stream id -> grpc-status
        self.remote_settings: dict[int, int] = {}
        self.resets: dict[int, int] = {}  # stream id -> RST_STREAM error code
        self.ping_acks = 0
        self._pump = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, port: int) -> H2Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        peer = cls(reader, writer)
        peer.conn.initiate_connection()
        peer.flush()
        return peer

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    def open(self, path: str = "/fairq.v1.Scheduler/Generate") -> int:
        stream = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "127.0.0.1"), ("content-type", "application/grpc"), ("te", "trailers"),
        ]  # fmt: skip
        self.conn.send_headers(stream, headers)
        self.flush()
        return stream

    async def _read(self) -> None:
        while data := await self.reader.read(65536):
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    for key, changed in event.changed_settings.items():
                        self.remote_settings[key] = changed.new_value
                headers = getattr(event, "headers", None)
                if isinstance(event, h2.events.PingAckReceived):
                    self.ping_acks += 1
                if isinstance(event, h2.events.StreamReset):
                    self.resets[event.stream_id] = event.error_code
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    for k, v in headers or ():
                        if k == b"grpc-status":
                            self.status[event.stream_id] = v.decode()
            self.flush()

    async def round_trip(self) -> None:
        """Send a PING and wait for its ACK: the server has read everything sent before it."""
        acks = self.ping_acks
        self.conn.ping(b"fairq-rt")
        self.flush()
        await until(lambda: self.ping_acks > acks, timeout=5, what="PING ACK")

    async def close(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await self._pump
        self.writer.close()


async def test_streams_that_never_deliver_a_request_are_answered_and_freed(
    fairq_factory: FairqFactory,
) -> None:
    """The server advertises MAX_CONCURRENT_STREAMS; a stream with headers only is answered
    DEADLINE_EXCEEDED after limits.request_receive_seconds (it used to be held for ever),
    a truncated message with END_STREAM is answered at once, and the freed streams take
    new calls on the same connection."""
    limits = RequestBounds(max_streams_per_connection=8, request_receive_seconds=0.5)
    server = await fairq_factory(replace(make_config(), limits=limits))
    peer = await H2Peer.connect(server.port)
    try:
        await until(lambda: bool(peer.remote_settings), what="server SETTINGS")
        assert peer.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 8
        headers_only = [peer.open() for _ in range(7)]
        truncated = peer.open()
        # A gRPC frame declaring 100 bytes, carrying 3, then END_STREAM.
        peer.conn.send_data(truncated, b"\x00\x00\x00\x00\x64abc", end_stream=True)
        peer.flush()
        await until(lambda: truncated in peer.status, timeout=5, what="truncated answered")
        # Answered, and reset by the server (the client never half-closed them): freed.
        await until(
            lambda: all(s in peer.resets for s in headers_only), timeout=5, what="all answered"
        )
        await peer.round_trip()
        again = [peer.open() for _ in range(8)]  # the 8 freed slots are usable again
        await until(
            lambda: all(s in peer.status for s in again), timeout=5, what=f"reuse {peer.resets}"
        )
    finally:
        await peer.close()
    assert {peer.status[s] for s in headers_only} == {"4"}  # DEADLINE_EXCEEDED
    assert peer.status[truncated] not in ("0", "2"), peer.status  # neither OK nor UNKNOWN
    assert {peer.status[s] for s in again} == {"4"}


# -- items 8 and 9: names that break logs and status messages -------------------------------


def _backend(backend_id: str, url: str, *models: str) -> admin_pb2.Backend:
    return admin_pb2.Backend(
        id=backend_id, kind=admin_pb2.BACKEND_KIND_VLLM, base_url=url, models=list(models)
    )


ROOT = (("authorization", "Bearer root-key"),)
ALICE = (("authorization", "Bearer alice-key"),)

BAD_REGISTRATIONS = {
    "model-300-chars": (_backend("b", "{url}", "m" * 300), "longer than 256"),
    "model-100-KB": (_backend("b", "{url}", "m" * 100_000), "longer than 256"),
    "model-newline": (_backend("b", "{url}", "m\nFORGED"), "control characters"),
    "65-models": (_backend("b", "{url}", *(f"m{i}" for i in range(65))), "the limit is 64"),
    "id-newline": (_backend("b\nFORGED", "{url}", "m"), "backend id may contain only"),
    "id-space": (_backend("b x", "{url}", "m"), "backend id may contain only"),
    "id-129-chars": (_backend("b" * 129, "{url}", "m"), "backend id must be 1-128"),
}


@pytest.mark.parametrize("case", sorted(BAD_REGISTRATIONS))
async def test_registration_applies_the_request_limits_to_ids_and_model_names(
    case: str, sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    backend, needle = BAD_REGISTRATIONS[case]
    backend.base_url = sim.url
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.RegisterBackend(
                admin_pb2.RegisterBackendRequest(backend=backend), metadata=ROOT, timeout=10
            )
        unknown = await run_call(generate(ch, gen_request(model="nope"), metadata=ALICE))
    assert info.value.code() == INVALID, info.value
    assert needle in (info.value.details() or "")
    assert server.core.backends() == []
    # The unknown-model answer stays NOT_FOUND (a registered 100 KB name used to turn every
    # one into RESOURCE_EXHAUSTED "received metadata size exceeds hard limit").
    assert unknown.code == grpc.StatusCode.NOT_FOUND, unknown


async def test_not_found_names_models_only_to_admins_and_within_a_status_message(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config(keys=list(KEYS.values())))
    models = [f"{i:03d}-" + "x" * 250 for i in range(64)]  # 16 KB of names on one backend
    # A backend without /v1/models (404): fairq takes its registration at its word (the
    # simulator lists only its own model, so the Admin API's model check would refuse it).
    async with HostileBackend() as unlisted, grpc.aio.insecure_channel(_target(server)) as ch:
        await admin_pb2_grpc.AdminStub(ch).RegisterBackend(
            admin_pb2.RegisterBackendRequest(backend=_backend("b", unlisted.url, *models)),
            metadata=ROOT,
            timeout=10,
        )
        as_user = await run_call(generate(ch, gen_request(model="nope"), metadata=ALICE))
        as_admin = await run_call(generate(ch, gen_request(model="nope"), metadata=ROOT))
    assert as_user.code == as_admin.code == grpc.StatusCode.NOT_FOUND, (as_user, as_admin)
    assert as_user.details == "model 'nope' is not served here"
    assert as_admin.details.startswith("model 'nope' is not served here; models: 000-xxx")
    assert as_admin.details.endswith(" more)") and len(as_admin.details) < 1200, as_admin


async def test_request_ids_outside_the_token_alphabet_are_refused(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)]))
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        forged = await run_call(generate(ch, gen_request(request_id="r1\nFORGED log line")))
        spaced = await run_call(generate(ch, gen_request(request_id="r 1")))
        fine = await run_call(generate(ch, gen_request(request_id="req-1.a_b:c/d@e+f=g~h")))
    assert forged.code == spaced.code == INVALID, (forged, spaced)
    assert "request_id may contain only" in forged.details
    assert fine.code == grpc.StatusCode.OK, fine


# -- item 12: a registration abandoned by its caller ---------------------------------------


def _orphan_sessions(server: FairqServer) -> list[aiohttp.ClientSession]:
    """Open aiohttp sessions that no registered backend owns."""
    owned = {id(e.backend._session) for e in server.core.backends()}
    return [
        o
        for o in gc.get_objects()
        if isinstance(o, aiohttp.ClientSession) and not o.closed and id(o) not in owned
    ]


async def test_a_registration_cancelled_by_its_deadline_closes_its_http_session(
    fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """RegisterBackend waits for the first scrape; a caller whose deadline passes first
    cancels it. The backend's HTTP session is closed then, not left for the garbage
    collector to complain about ("Unclosed client session")."""
    # A scrape timeout (5 x the poll interval) well past the caller's 0.5 s deadline.
    server = await fairq_factory(make_config(poll_interval_seconds=1.0))
    caplog.set_level(logging.ERROR, logger="asyncio")
    before = len(_orphan_sessions(server))
    async with HostileBackend(metrics="silent") as hostile:
        async with grpc.aio.insecure_channel(_target(server)) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await admin_pb2_grpc.AdminStub(ch).RegisterBackend(
                    admin_pb2.RegisterBackendRequest(backend=_backend("b", hostile.url, "m")),
                    timeout=0.5,
                )
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The registration is undone: not left registered (and never polled), nothing open.
        await until(
            lambda: not server.core.backends() and len(_orphan_sessions(server)) <= before,
            what="registration undone and its session closed",
        )
    gc.collect()
    assert "Unclosed client session" not in caplog.text


# -- generic tooling: health List, reflection v1 -------------------------------------------


async def test_health_list_names_every_service(fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config())
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).List(health_pb2.HealthListRequest())
    serving = health_pb2.HealthCheckResponse.SERVING
    assert {name: s.status for name, s in reply.statuses.items()} == {
        "": serving,
        "fairq.v1.Scheduler": serving,
        "fairq.v1.Admin": serving,
    }


Reflection = reflection_pb2.ServerReflectionRequest


async def _reflect(
    ch: grpc.aio.Channel, version: str, *requests: Reflection
) -> list[reflection_pb2.ServerReflectionResponse]:
    method = ch.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return [r async for r in method(iter(requests), timeout=10)]


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_reflection_is_served_as_v1_and_v1alpha(
    version: str, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config())
    async with grpc.aio.insecure_channel(_target(server)) as ch:
        listed, described = await _reflect(
            ch,
            version,
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="fairq.v1.Scheduler"),
        )
    names = {s.name for s in listed.list_services_response.service}
    assert {"fairq.v1.Scheduler", "fairq.v1.Admin", "grpc.health.v1.Health"} <= names
    assert {
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names
    assert described.file_descriptor_response.file_descriptor_proto, described
