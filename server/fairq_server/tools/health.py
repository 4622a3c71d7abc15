"""``fairq health``: ask a fairq for its ``grpc.health.v1`` status; exit 0 when SERVING.

Made for container health checks and probes, where no grpcurl or grpc_health_probe is
installed: it uses the gRPC and health-checking packages fairq itself runs on.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["check", "main"]


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
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


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
