"""What the operator tools that call the Admin service share: where, as whom, and errors."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import grpc

from fairq.v1 import admin_pb2_grpc

__all__ = ["add_target_arguments", "admin_stub", "call"]

T = TypeVar("T")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--target``, ``--api-key``, ``--as-user``, ``--tls-ca`` and ``--timeout``."""
    parser.add_argument("--target", default="127.0.0.1:50051", help="host:port of fairq")
    parser.add_argument("--api-key", help="an admin key (default: $FAIRQ_API_KEY)")
    parser.add_argument("--as-user", help="x-fairq-user name, for a fairq without keys")
    parser.add_argument("--tls-ca", help="CA certificate (PEM) when fairq serves TLS")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per call")


@contextmanager
def admin_stub(
    args: argparse.Namespace,
) -> Iterator[tuple[admin_pb2_grpc.AdminStub, tuple[tuple[str, str | bytes], ...]]]:
    """Yield an Admin stub for ``args.target`` and the metadata naming the caller."""
    metadata: list[tuple[str, str | bytes]] = []
    api_key = args.api_key or os.environ.get("FAIRQ_API_KEY")
    if api_key:
        metadata.append(("authorization", f"Bearer {api_key}"))
    if args.as_user:
        metadata.append(("x-fairq-user", args.as_user))
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        channel = grpc.secure_channel(args.target, credentials)
    else:
        channel = grpc.insecure_channel(args.target)
    with channel:
        yield admin_pb2_grpc.AdminStub(channel), tuple(metadata)


def call(prog: str, target: str, rpc: Callable[[], T]) -> T | None:
    """Run ``rpc``; on a gRPC error print ``prog: target: CODE: details`` and return None."""
    try:
        return rpc()
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        print(f"{prog}: {target}: {code.name if code else 'error'}: {details}", file=sys.stderr)
        return None
