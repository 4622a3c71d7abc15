"""The cheapest ext_proc picker: every request to one backend at once, nothing decided.

Envoy's external processing protocol served by grpc.aio on uvloop, answering as fairq's door
does (the headers at once, the body with the ``x-gateway-destination-endpoint`` header) but
without reading, queueing or accounting anything: the floor of a Python picker's round trip,
beside which ``fairq bench envoy`` sets fairq's. Run as ``python -m
fairq_bench.scenarios.null_extproc --backend HOST:PORT``; it prints its address on the first
line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

__all__ = ["main"]


def _answer(endpoint: str) -> pb.ProcessingResponse:
    header = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(
            key="x-gateway-destination-endpoint", raw_value=endpoint.encode()
        )
    )
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(
            response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[header]))
        )
    )


async def _serve(endpoint: str) -> None:
    answer = _answer(endpoint)
    proceed = pb.ProcessingResponse(request_headers=pb.HeadersResponse())

    async def process(
        requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        async for message in requests:
            if message.HasField("request_headers"):
                yield proceed
            elif message.HasField("request_body") and message.request_body.end_of_stream:
                yield answer

    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(
        process,
        request_deserializer=pb.ProcessingRequest.FromString,
        response_serializer=pb.ProcessingResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "envoy.service.ext_proc.v3.ExternalProcessor", {"Process": handler}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    """Serve until killed."""
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="HOST:PORT every request goes to")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(args.backend))


if __name__ == "__main__":
    main()
