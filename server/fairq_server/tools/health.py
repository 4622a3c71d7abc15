"""``fairq health``: ask a fairq for its ``grpc.health.v1`` status; exit 0 when SERVING.

Made for container health checks and probes, where no grpcurl or grpc_health_probe is
installed: it uses the gRPC package fairq itself runs on.

The two messages of ``grpc.health.v1.Health/Check`` are encoded here, not through the
generated protobuf classes: importing protobuf and the health stubs took about half of the
command's time (0.15-0.25 s on a busy machine, beside gRPC's own 0.1-0.15 s), and a probe
runs every few seconds. The messages are frozen by the gRPC health protocol: a request with
one string field (``service = 1``), an answer with one enum field (``status = 1``);
``tests/tools/test_operator_tools.py`` checks the encoding against the generated classes.
"""

from __future__ import annotations

import argparse
import sys

import grpc

__all__ = ["STATUSES", "check", "decode_status", "encode_request", "main"]

_METHOD = "/grpc.health.v1.Health/Check"
#: ``HealthCheckResponse.ServingStatus`` by number.
STATUSES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_request(service: str) -> bytes:
    """Return the wire bytes of ``HealthCheckRequest(service=service)``."""
    if not service:
        return b""  # every field at its default: the empty message
    raw = service.encode()
    return b"\x0a" + _varint(len(raw)) + raw  # field 1, length-delimited


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def decode_status(data: bytes) -> str:
    """Return the status name in the wire bytes of a ``HealthCheckResponse``.

    Raises:
        ValueError: the bytes are not a protobuf message.

    """
    status, pos = 0, 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            if field == 1:
                status = value
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated message")
    return STATUSES.get(status, str(status))


def check(
    target: str,
    service: str = "",
    timeout: float = 3.0,
    credentials: grpc.ChannelCredentials | None = None,
) -> str:
    """Return the serving status name of ``service`` at ``target`` (``"SERVING"``, ...).

    Raises:
        grpc.RpcError: the call failed (unreachable, unknown service, deadline).

    """
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_METHOD)
        response: bytes = call(encode_request(service), timeout=timeout)
    return decode_status(response)


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq health``: 0 when SERVING, 1 otherwise (the reason on stderr)."""
    parser = argparse.ArgumentParser(
        prog="fairq health",
        description="Ask a fairq for its gRPC health status; print it and exit 0 when "
        "SERVING, 1 otherwise. For container health checks and probes: nothing else to "
        "install.",
    )
    parser.add_argument("--target", default="127.0.0.1:50051", help="host:port of fairq")
    parser.add_argument("--service", default="", help="'' (the server) or e.g. fairq.v1.Scheduler")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    parser.add_argument("--tls-ca", help="CA certificate (PEM) when fairq serves TLS")
    args = parser.parse_args(argv)
    credentials = None
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    try:
        status = check(args.target, args.service, args.timeout, credentials)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        print(f"fairq health: {args.target}: {code.name if code else exc}", file=sys.stderr)
        return 1
    print(status)
    return 0 if status == "SERVING" else 1
