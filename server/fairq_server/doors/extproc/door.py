"""The ext_proc door: fairq as the endpoint picker of an Envoy that carries the bytes.

Envoy's external processing filter opens one gRPC stream per HTTP request and sends the
request's headers and its buffered body (without waiting for the headers' answer). The door
authenticates the ``Authorization`` header as the HTTP door does (keys, JWTs; in open mode
``x-fairq-user`` or the body's ``user``), parses the body with the HTTP door's parser, and
queues the request with an :class:`~.carrier.EnvoyCarrier`: the dispatcher picks the backend
and holds the slot, and the door answers the body message only then, naming the endpoint the
way the Gateway API Inference Extension does (the ``x-gateway-destination-endpoint`` header
and ``envoy.lb`` dynamic metadata), so Envoy's original-destination cluster sends it there.
Refusals are immediate responses with the HTTP door's statuses and OpenAI-shaped bodies (429
with ``Retry-After`` for quotas, 503 when nothing can serve).

The same gRPC server takes the Lua filter's word that a response's first bytes arrived (the
request runs on its engine, for the gate), and Envoy's access log stream: one entry per
request at its end, with the usage the Lua filter read from the backend's last chunk, which
ends the request's attempt (:meth:`~.carrier.EnvoyCarrier.report`). fairq does no work per
token.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from fairq_server.config.envoy import ExtprocConfig
from fairq_server.doors.access_log import RequestLog, RequestTrace
from fairq_server.doors.extproc.bootstrap import cluster_name
from fairq_server.doors.extproc.carrier import EnvoyCarrier, Usage
from fairq_server.doors.http import json_body
from fairq_server.doors.http.errors import HttpError, error_body, error_for
from fairq_server.doors.http.parse import Kind, ParsedRequest, parse_request
from fairq_server.doors.lifecycle import (
    DoorBase,
    count_rejection,
    describe_request,
    ticket_events,
)
from fairq_server.errors import InternalError, SchedulerError
from fairq_server.identity.auth import Authenticator, Principal
from fairq_server.port import CorePort, Submission
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.ticket import Carrier, Ticket

__all__ = ["DESTINATION", "ExtprocDoor", "endpoint_of"]

log = logging.getLogger(__name__)

#: The Gateway API Inference Extension's name for the chosen endpoint (header and metadata).
DESTINATION = "x-gateway-destination-endpoint"
_TICKET = "x-fairq-ticket"
_REPLICA = "x-fairq-replica"

_CONTINUE = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
_FULL_DUPLEX = 4  # ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED
_USAGE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+).*?"completion_tokens"\s*:\s*(\d+)', re.S)


def endpoint_of(backend: BackendState) -> str:
    """Return ``host:port`` of ``backend``'s base URL (where Envoy sends its requests)."""
    url = backend.backend.url("")
    host = url.host or "127.0.0.1"
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _headers(message: base_pb2.HeaderMap) -> list[tuple[str, str]]:
    return [(h.key.lower(), h.raw_value.decode("latin-1") or h.value) for h in message.headers]


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1")),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _immediate(status: int, body: bytes, retry_after: int | None = None) -> pb.ProcessingResponse:
    headers = [_header("content-type", "application/json")]
    if retry_after is not None:
        headers.append(_header("retry-after", str(retry_after)))
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=pb.HeaderMutation(set_headers=headers),
            body=body,
            details="fairq",
        )
    )


def _error(error: HttpError, retry_after: int) -> pb.ProcessingResponse:
    retry = None
    if error.status in (429, 503):
        retry = max(error.retry_after, 1) if error.retry_after is not None else retry_after
    body = error_body(error.message, error.type, param=error.param, code=error.code)
    return _immediate(error.status, body, retry)


def _kind(path: str) -> Kind | None:
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completion"
    return None


class _AccessLog(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    def __init__(self, door: ExtprocDoor) -> None:
        self._door = door

    async def StreamAccessLogs(
        self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage], context: Any
    ) -> als_pb2.StreamAccessLogsResponse:
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                self._door.logged(entry)
        return als_pb2.StreamAccessLogsResponse()


class CarryingCore(CorePort, Protocol):
    """The port, and the one thing more this door asks: to queue a request it carries."""

    def submit_carried(self, submission: Submission, carrier: Carrier) -> Ticket:
        """Queue ``submission``; its attempt reads ``carrier``'s stream (see FairqCore)."""


class ExtprocDoor(DoorBase):
    """The ext_proc and access log services on one gRPC server at ``[extproc] listen``.

    Args:
        core: the scheduling core.
        auth: the authenticator every door shares.
        request_log: the request log.
        replica: this replica's name (Envoy sends each access log entry to its replica).

    """

    def __init__(
        self,
        core: CarryingCore,
        auth: Authenticator,
        request_log: RequestLog | None = None,
        replica: str = "fairq",
    ) -> None:
        super().__init__(core, auth, request_log)
        self._carrying = core
        self._replica = replica
        self._hooks_cluster = cluster_name(replica)
        self._ids = itertools.count(1)
        self._carriers: dict[str, EnvoyCarrier] = {}
        self._ending: set[asyncio.Task[None]] = set()  # dispatched requests awaiting their end
        self._server: grpc.aio.Server | None = None
        self._created = int(time.time())
        self.port = 0

    @property
    def _settings(self) -> ExtprocConfig:
        return self._core.config.extproc

    async def start(self, listen: str) -> None:
        """Bind ``listen`` and serve."""
        limit = self._settings.max_connections
        self._server = grpc.aio.server()
        # The door's own generator serves the stream (no servicer around it: one generator
        # fewer per message on the first token's path).
        process = grpc.stream_stream_rpc_method_handler(
            self.process,
            request_deserializer=pb.ProcessingRequest.FromString,
            response_serializer=pb.ProcessingResponse.SerializeToString,
        )
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "envoy.service.ext_proc.v3.ExternalProcessor", {"Process": process}
                ),
            )
        )
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(_AccessLog(self), self._server)
        hooks = {
            "FirstByte": grpc.unary_unary_rpc_method_handler(
                self._first_byte,
                request_deserializer=lambda data: data,
                response_serializer=lambda data: data,
            )
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("fairq.extproc.Hooks", hooks),)
        )
        self.port = self._server.add_insecure_port(listen)
        if not self.port:
            raise OSError(f"cannot listen on {listen}")
        log.debug("ext_proc door: at most %d connections", limit)
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """Stop serving; running requests' streams get ``grace`` seconds."""
        if self._server is not None:
            await self._server.stop(grace)
        for pump in list(self._ending):
            pump.cancel()
        await asyncio.gather(*self._ending, return_exceptions=True)

    # -- what Envoy tells of a running request -------------------------------------------

    async def _first_byte(self, request: bytes, context: Any) -> bytes:
        """Take the Lua filter's call: a request's first response bytes (one string field)."""
        if len(request) >= 2 and request[0] == 0x0A:
            carrier = self._carriers.get(request[2 : 2 + request[1]].decode("latin-1"))
            if carrier is not None:
                carrier.first_byte()
        return b""

    def logged(self, entry: Any) -> None:
        """Take one access log entry: the end of a request this replica dispatched."""
        ticket_id = entry.request.request_headers.get(_TICKET)
        carrier = self._carriers.get(ticket_id) if ticket_id else None
        if carrier is None:
            return
        common = entry.common_properties
        prompt = completion = None
        meta = common.metadata.filter_metadata.get("fairq")
        if meta is not None and "usage" in meta.fields:
            parts = meta.fields["usage"].string_value.split()
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                prompt, completion = int(parts[0]), int(parts[1])
        status = entry.response.response_code.value
        carrier.report(
            Usage(
                prompt_tokens=prompt,
                completion_tokens=completion,
                status=status,
                body_bytes=entry.response.response_body_bytes,
                client_left=common.response_flags.downstream_connection_termination or status == 0,
            )
        )

    # -- one request ----------------------------------------------------------------------

    async def process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any = None
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Answer one ext_proc stream (one HTTP request); see the module's description."""
        arrival = time.monotonic()
        retry_after = self._core.config.http.retry_after_seconds
        it = aiter(requests)
        first = await anext(it, None)
        if first is None or not first.HasField("request_headers"):
            return
        headers = _headers(first.request_headers.headers)
        values = dict(headers)
        path = values.get(":path", "")
        if first.request_headers.end_of_stream:  # no body: GET /v1/models, or nothing
            yield await self._bodiless(values.get(":method", ""), path, headers, retry_after)
            return
        # A gateway of the Inference Extension streams the body (FULL_DUPLEX_STREAMED): the
        # headers' answer then carries the destination, after the body. fairq's bootstrap
        # buffers it, and the headers are answered at once.
        duplex = first.protocol_config.request_body_mode == _FULL_DUPLEX
        if not duplex:
            yield _CONTINUE
        kind = _kind(path)
        body = bytearray()
        async for message in it:
            if message.HasField("request_body"):
                body += message.request_body.body
                if message.request_body.end_of_stream:
                    break
        else:
            return  # Envoy gave up on the request
        trace = RequestTrace(arrival=arrival)
        try:
            if kind is None:
                raise HttpError(404, f"no such path here: {path[:256]}", code="not_found")
            parsed, document = await self._parse(bytes(body), kind)
            trace.request_id, trace.model = parsed.request.request_id, parsed.request.model
            principal = await self._authenticate(headers, parsed.user)
            carrier = EnvoyCarrier(
                self._settings.usage_grace_seconds, self._settings.max_request_seconds
            )
            submission = describe_request(
                self._core,
                principal,
                parsed.request,
                values.get("x-fairq-tier", ""),
                arrival=arrival,
                max_tokens=_output_bound(parsed),
            )
            ticket = self._carrying.submit_carried(submission, carrier)
        except HttpError as exc:
            yield _error(exc, retry_after)
            return
        except SchedulerError as exc:
            count_rejection(self._core, exc)
            self._request_log.finished(trace, exc.outcome)
            yield _error(error_for(exc), retry_after)
            return
        trace.user, trace.group, trace.team = principal.user, principal.group, principal.team
        trace.tier = self._core.tier_names[ticket.tier]
        # Not guessable: the access log and first-byte calls name it, and only Envoy may.
        ticket_id = f"{self._replica}-{next(self._ids)}-{secrets.token_hex(6)}"
        self._carriers[ticket_id] = carrier
        events = ticket_events(
            self._core,
            ticket,
            on_end=lambda outcome: self._request_log.finished(trace, outcome),
            trace=trace,
        )
        pump = asyncio.create_task(_pump(events, carrier))
        dispatched = False
        try:
            try:
                backend = await carrier.dispatched
            except SchedulerError as exc:
                yield _error(error_for(exc), retry_after)
                return
            dispatched = True
            answer = self._dispatch(ticket, backend, parsed, document, ticket_id)
            if duplex:
                for response in _duplex(answer, bytes(body)):
                    yield response
            else:
                yield answer
            # fairq's bootstrap asks for nothing more, and Envoy closes the stream at the
            # request's end; a gateway may send the response too (answered as it comes).
            async for message in it:
                response = _later(message, carrier, duplex)
                if response is not None:
                    yield response
        finally:
            if dispatched:
                # Envoy closes the stream at the request's end and resets it at once: the
                # request's end (and its usage) is the carrier's to settle, not this task's.
                carrier.closed()
                self._ending.add(pump)
                pump.add_done_callback(lambda task: self._ended(task, ticket_id))
            else:  # refused, or Envoy reset the stream while queued: the client is gone
                self._carriers.pop(ticket_id, None)
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                if carrier.dispatched.done() and not carrier.dispatched.cancelled():
                    carrier.dispatched.exception()  # retrieved: a refusal was answered

    def _ended(self, pump: asyncio.Task[None], ticket_id: str) -> None:
        self._ending.discard(pump)
        self._carriers.pop(ticket_id, None)

    async def _bodiless(
        self, method: str, path: str, headers: list[tuple[str, str]], retry_after: int
    ) -> pb.ProcessingResponse:
        """Answer a request without a body: the models list, or 404."""
        if method != "GET" or path.split("?", 1)[0].rstrip("/") != "/v1/models":
            return _error(HttpError(404, "not found here", code="not_found"), retry_after)
        try:
            principal = await self._authenticate(headers, None)
        except SchedulerError as exc:
            return _error(error_for(exc), retry_after)
        models = (
            sorted(self._core.served_models())
            if principal.tiers & set(self._core.tier_names)
            else []
        )
        data = [
            {"id": m, "object": "model", "created": self._created, "owned_by": "fairq"}
            for m in models
        ]
        return _immediate(200, orjson.dumps({"object": "list", "data": data}))

    async def _parse(self, body: bytes, kind: Kind) -> tuple[ParsedRequest, object]:
        config = self._core.config
        if len(body) > config.limits.max_body_bytes:
            raise HttpError(413, "the request body is too large", code="too_large")
        try:
            document = await json_body.loads(body)
        except RecursionError:
            raise HttpError(400, "the request body is nested too deeply") from None
        except ValueError as exc:
            raise HttpError(400, f"the request body is not valid JSON: {exc}") from None
        return parse_request(document, kind, config.limits), document

    async def _authenticate(self, headers: list[tuple[str, str]], user: str | None) -> Principal:
        if self._auth.open_mode and user and not any(k == "x-fairq-user" for k, _ in headers):
            headers = [*headers, ("x-fairq-user", user)]
        return await self._auth.authenticate(headers)

    def _dispatch(
        self,
        ticket: Ticket,
        backend: BackendState,
        parsed: ParsedRequest,
        document: object,
        ticket_id: str,
    ) -> pb.ProcessingResponse:
        """Return the answer that sends the request to ``backend``."""
        endpoint = endpoint_of(backend)
        adapter = backend.backend
        set_headers = [
            _header(DESTINATION, endpoint),
            _header(_TICKET, ticket_id),
            _header(_REPLICA, self._replica),
        ]
        remove = ["x-fairq-tier", "x-fairq-user"]
        # The caller's fairq credential is not the backend's: its own key, or none.
        credential = adapter._headers.get("authorization")
        if credential:
            set_headers.append(_header("authorization", credential))
        else:
            remove.append("authorization")
        body = self._body(ticket, backend, parsed, document)
        mutation = None
        if body is not None:
            mutation = pb.BodyMutation(body=body)
            set_headers.append(_header("content-length", str(len(body))))
        metadata = struct_pb2.Struct()
        metadata.update(
            {
                "envoy.lb": {DESTINATION: endpoint},
                "fairq": {"ticket": ticket_id, "cluster": self._hooks_cluster},
            }
        )
        return pb.ProcessingResponse(
            request_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    header_mutation=pb.HeaderMutation(
                        set_headers=set_headers, remove_headers=remove
                    ),
                    body_mutation=mutation,
                )
            ),
            dynamic_metadata=metadata,
        )

    def _body(
        self, ticket: Ticket, backend: BackendState, parsed: ParsedRequest, document: object
    ) -> bytes | None:
        """Return the body to pass on, if it differs from the caller's (None: as sent)."""
        if not isinstance(document, dict):
            return None
        changed = False
        if parsed.stream and self._settings.include_usage and not parsed.include_usage:
            options = document.get("stream_options")
            document["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
            changed = True
        adapter = backend.backend
        if adapter.priority_scheduling:
            order = getattr(adapter, "priority_order", "lower-first")
            document["priority"] = -ticket.priority if order == "higher-first" else ticket.priority
            changed = True
        return orjson.dumps(document) if changed else None


def _duplex(answer: pb.ProcessingResponse, body: bytes) -> list[pb.ProcessingResponse]:
    """Split the dispatch answer for a streamed body: headers first, then the body back."""
    common = answer.request_body.response
    mutation = common.body_mutation.body if common.HasField("body_mutation") else body
    headers = pb.HeadersResponse(response=pb.CommonResponse(header_mutation=common.header_mutation))
    streamed = pb.BodyMutation(
        streamed_response=pb.StreamedBodyResponse(body=mutation, end_of_stream=True)
    )
    return [
        pb.ProcessingResponse(request_headers=headers, dynamic_metadata=answer.dynamic_metadata),
        pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=streamed))
        ),
    ]


def _later(
    message: pb.ProcessingRequest, carrier: EnvoyCarrier, duplex: bool
) -> pb.ProcessingResponse | None:
    """Answer what a gateway sends after dispatch: the response's headers, body, trailers."""
    which = message.WhichOneof("request")
    if which == "response_headers":
        carrier.first_byte()
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    if which == "response_body":
        chunk = message.response_body
        found = _USAGE.findall(chunk.body[-2048:]) if b"completion_tokens" in chunk.body else []
        if found:
            prompt, completion = found[-1]
            carrier.report(Usage(int(prompt), int(completion), 200, 0, client_left=False))
        if not duplex:
            return pb.ProcessingResponse(response_body=pb.BodyResponse())
        streamed = pb.BodyMutation(
            streamed_response=pb.StreamedBodyResponse(
                body=chunk.body, end_of_stream=chunk.end_of_stream
            )
        )
        return pb.ProcessingResponse(
            response_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=streamed))
        )
    if which == "request_trailers":
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    if which == "response_trailers":
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return None


async def _pump(events: AsyncIterator[Any], carrier: EnvoyCarrier) -> None:
    """Read the ticket's events to its end; an error before dispatch goes to the door."""
    try:
        async for _ in events:
            pass
    except SchedulerError as exc:
        if not carrier.dispatched.done():
            carrier.dispatched.set_exception(exc)
    except Exception as exc:
        if not carrier.dispatched.done():
            carrier.dispatched.set_exception(exc)
    finally:
        if not carrier.dispatched.done():
            carrier.dispatched.set_exception(InternalError())
        await events.aclose()  # type: ignore[attr-defined]


def _output_bound(parsed: ParsedRequest) -> int | None:
    value = parsed.request.extra.get("max_completion_tokens")
    return value if isinstance(value, int) else None
