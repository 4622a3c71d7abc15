"""What lets generic tools find their way around fairq: health (with ``List``) and reflection.

``grpc.health.v1.Health/List`` is newer than grpcio's asyncio health servicer, which answers
it UNIMPLEMENTED with a traceback in the log; :class:`HealthServicer` adds it.

Reflection is served as ``grpc.reflection.v1`` (what current grpcurl, Postman and
grpc-gateway tooling ask first) and ``v1alpha`` (older tools). grpcio-reflection ships only
``v1alpha``; the two versions' messages are identical field for field and number for number,
so the v1 method is the same servicer registered under the v1 name with the v1alpha message
classes doing the (identical) encoding. No generated v1 code is needed; the v1 schema that
reflection hands out (tools that list methods resolve every service they see) is the v1alpha
file descriptor renamed, added to the default pool once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

__all__ = ["REFLECTION_V1", "HealthServicer", "enable_reflection"]

REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


class HealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    """grpcio's asyncio health servicer plus ``List``."""

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthListResponse:
        """Return the status of every service with a registered status."""
        statuses = {
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in self._server_status.items()
        }
        return health_pb2.HealthListResponse(statuses=statuses)


def _add_v1_schema() -> None:
    """Add ``grpc/reflection/v1/reflection.proto`` to the default pool (v1alpha, renamed)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindServiceByName(REFLECTION_V1)
        return
    except KeyError:
        pass
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = "grpc.reflection.v1"
    proto.ClearField("options")
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    pool.Add(proto)


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection v1 and v1alpha on ``server`` for ``service_names`` (and themselves)."""
    _add_v1_schema()
    names = (*service_names, reflection.SERVICE_NAME, REFLECTION_V1)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)  # v1alpha
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )
