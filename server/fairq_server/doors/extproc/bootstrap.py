"""An Envoy bootstrap that puts fairq's ext_proc door in front of the configured backends.

``fairq envoy bootstrap --config FILE`` prints it (YAML). The pieces, in the order a request
meets them:

- the listener at ``[envoy] listen``, one HTTP connection manager;
- ``header_mutation`` strips a client-sent ``x-gateway-destination-endpoint`` (and fairq's own
  ``x-fairq-*`` headers) before anything else sees the request;
- ``ext_proc`` asks fairq, sending the request's headers and its buffered body (the body
  without waiting for the headers' answer: one round trip); fairq holds the answer until
  dispatch, so its message timeout allows the queue's TTL. fairq unreachable, or an error on
  its stream, is a 503 at once (``failure_mode_allow: false``), never a pass-through;
- ``lua`` tells the replica that dispatched the request when its first body bytes arrive (one
  asynchronous call: the request runs on its engine, its slot counts as running), and looks at
  the tail of each response chunk for the backend's ``usage`` block, which it puts in the
  request's dynamic metadata (namespace ``fairq``);
- the router sends the request to the ``ORIGINAL_DST`` cluster, which takes the endpoint from
  the ``x-gateway-destination-endpoint`` header fairq set (the Gateway API Inference
  Extension's convention; fairq sets the ``envoy.lb`` metadata too). A request fairq did not
  answer has no such header, and the cluster has no other host: 503;
- at the stream's end (finished, failed or the client gone) the gRPC access log service
  sends one entry to the replica that dispatched the request (one logger per replica,
  filtered on ``x-fairq-replica``): the end of the request and its usage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LUA_FIRST_BYTE", "LUA_USAGE", "EnvoySetup", "bootstrap", "cluster_name", "to_yaml"]

#: Finds the usage block near the end of a response: each chunk's last 512 bytes are scanned
#: (with the chunk before it, as a block may be cut between two), the last block seen wins.
#: No chunk is held: the body streams on untouched. The first chunk also calls the replica
#: that dispatched the request (its first token, for the gate).
LUA_USAGE = """\
-- A gRPC message of one string field (the ticket), framed: fairq.extproc.Hooks/FirstByte.
local function frame(ticket)
  return string.char(0, 0, 0, 0, #ticket + 2, 10, #ticket) .. ticket
end

function envoy_on_response(handle)
  local meta = handle:streamInfo():dynamicMetadata():get("fairq")
  local hook = meta ~= nil and meta["cluster"] ~= nil and meta["ticket"] ~= nil
  local prev = ""
  local found = nil
  for chunk in handle:bodyChunks() do
    local n = chunk:length()
    if n > 0 then
      if hook then
        -- The first body bytes: the request runs on its engine (told once, not awaited).
        hook = false
        handle:httpCall(meta["cluster"], {
          [":method"] = "POST", [":path"] = "/fairq.extproc.Hooks/FirstByte",
          [":authority"] = "fairq", ["content-type"] = "application/grpc", ["te"] = "trailers",
        }, frame(meta["ticket"]), 5000, true)
      end
      local from = 0
      if n > 512 then from = n - 512 end
      local s = chunk:getBytes(from, n - from)
      -- A block cut between two chunks is found with the chunk before it.
      if string.find(s, 'completion_tokens', 1, true) then found = prev .. s end
      prev = s
    end
  end
  if found then
    local p = 0
    local c = 0
    for v in string.gmatch(found, '"prompt_tokens"%s*:%s*(%d+)') do p = v end
    for v in string.gmatch(found, '"completion_tokens"%s*:%s*(%d+)') do c = v end
    handle:streamInfo():dynamicMetadata():set("fairq", "usage", p .. " " .. c)
  end
end
"""


#: The first-byte call only: the script ends at the first chunk, and the rest of the body
#: streams on without Lua (no usage block read: fairq estimates the tokens from the bytes).
LUA_FIRST_BYTE = """\
local function frame(ticket)
  return string.char(0, 0, 0, 0, #ticket + 2, 10, #ticket) .. ticket
end

function envoy_on_response(handle)
  local meta = handle:streamInfo():dynamicMetadata():get("fairq")
  if meta == nil or meta["cluster"] == nil or meta["ticket"] == nil then
    return
  end
  for chunk in handle:bodyChunks() do
    if chunk:length() > 0 then
      handle:httpCall(meta["cluster"], {
        [":method"] = "POST", [":path"] = "/fairq.extproc.Hooks/FirstByte",
        [":authority"] = "fairq", ["content-type"] = "application/grpc", ["te"] = "trailers",
      }, frame(meta["ticket"]), 5000, true)
      return
    end
  end
end
"""


@dataclass(frozen=True)
class EnvoySetup:
    """What the bootstrap needs.

    Attributes:
        listen: ``host:port`` Envoy serves clients on.
        extproc: each fairq replica's ext_proc door, ``(replica name, host:port)``.
        message_timeout_seconds: how long Envoy waits for fairq's answer (the queue's wait).
        admin_listen: Envoy's admin interface (empty: none).
        connect_timeout_seconds: to fairq and to backends; fairq unreachable is a 503 after it.
        max_body_bytes: the largest request body Envoy buffers for fairq (fairq's
            ``limits.max_body_bytes``; Envoy answers 413 above it).
        read_usage: the Lua filter reads the usage block from the response's chunks (a
            little of Envoy's CPU per chunk); False: it stops at the first chunk, and fairq
            charges an estimate from the response's bytes.

    """

    listen: str
    extproc: Sequence[tuple[str, str]]
    message_timeout_seconds: float = 300.0
    admin_listen: str = ""
    connect_timeout_seconds: float = 0.25
    read_usage: bool = True
    max_body_bytes: int = 8_388_608


#: Envoy's default circuit breakers (1,024 requests, connections, pending) would refuse
#: requests fairq admitted: fairq's gate is the bound.
_UNBOUNDED = {
    "max_connections": 1_000_000,
    "max_pending_requests": 1_000_000,
    "max_requests": 1_000_000,
}


def _address(host_port: str) -> dict[str, Any]:
    host, _, port = host_port.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return {"socket_address": {"address": host, "port_value": int(port)}}


def _seconds(value: float) -> str:
    return f"{value:.3f}s"


def _typed(kind: str, **fields: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/{kind}", **fields}


def _http2_cluster(name: str, address: str, connect_timeout: float) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": _seconds(connect_timeout),
        "circuit_breakers": {"thresholds": [_UNBOUNDED]},  # one stream per queued request
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                explicit_http_config={"http2_protocol_options": {}},
            )
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(address)}}]}],
        },
    }


def cluster_name(replica: str) -> str:
    """Return the name of the cluster of ``replica`` alone (its access log, its hooks)."""
    return "fairq_" + re.sub(r"[^A-Za-z0-9_]", "_", replica)


def bootstrap(setup: EnvoySetup) -> dict[str, Any]:
    """Return the bootstrap for ``setup`` (a document for ``envoy -c``)."""
    timeout = _seconds(setup.message_timeout_seconds)
    # ext_proc streams are spread over every replica (one cluster of them all).
    extproc_cluster = _http2_cluster(
        "fairq_extproc", setup.extproc[0][1], setup.connect_timeout_seconds
    )
    extproc_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": {"address": _address(address)}} for _, address in setup.extproc
    ]
    extproc_cluster["type"] = "STRICT_DNS"
    clusters = [extproc_cluster]
    loggers = []
    for replica, address in setup.extproc:
        name = cluster_name(replica)
        cluster = _http2_cluster(name, address, setup.connect_timeout_seconds)
        cluster["type"] = "STRICT_DNS"
        clusters.append(cluster)
        loggers.append(
            {
                "name": "envoy.access_loggers.http_grpc",
                "filter": {
                    "header_filter": {
                        "header": {
                            "name": "x-fairq-replica",
                            "string_match": {"exact": replica},
                        }
                    }
                },
                "typed_config": _typed(
                    "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
                    common_config={
                        "log_name": "fairq",
                        "transport_api_version": "V3",
                        "grpc_service": {"envoy_grpc": {"cluster_name": name}},
                        # Each entry at once: it ends a request and frees its slot.
                        "buffer_size_bytes": 0,
                        "buffer_flush_interval": "0.001s",
                    },
                    additional_request_headers_to_log=["x-fairq-ticket"],
                ),
            }
        )
    clusters.append(
        {
            "name": "fairq_backends",
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            # A busy engine's accept queue can be long; fairq's slots bound the requests.
            "connect_timeout": "5s",
            "circuit_breakers": {"thresholds": [_UNBOUNDED]},
            "original_dst_lb_config": {
                "use_http_header": True,
                "http_header_name": "x-gateway-destination-endpoint",
            },
        }
    )
    http_filters = [
        {
            "name": "envoy.filters.http.header_mutation",
            "typed_config": _typed(
                "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                mutations={
                    "request_mutations": [
                        {"remove": name}
                        for name in (
                            "x-gateway-destination-endpoint",
                            "x-fairq-ticket",
                            "x-fairq-replica",
                        )
                    ]
                },
            ),
        },
        {
            "name": "envoy.filters.http.ext_proc",
            "typed_config": _typed(
                "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                grpc_service={
                    "envoy_grpc": {"cluster_name": "fairq_extproc"},
                    "timeout": timeout,
                },
                failure_mode_allow=False,
                status_on_error={"code": 503},
                message_timeout=timeout,
                max_message_timeout=timeout,
                send_body_without_waiting_for_header_response=True,
                processing_mode={
                    "request_header_mode": "SEND",
                    "request_body_mode": "BUFFERED",
                    "response_header_mode": "SKIP",
                    "response_body_mode": "NONE",
                    "request_trailer_mode": "SKIP",
                    "response_trailer_mode": "SKIP",
                },
                metadata_options={"receiving_namespaces": {"untyped": ["envoy.lb", "fairq"]}},
            ),
        },
        {
            "name": "envoy.filters.http.lua",
            "typed_config": _typed(
                "envoy.extensions.filters.http.lua.v3.Lua",
                default_source_code={
                    "inline_string": LUA_USAGE if setup.read_usage else LUA_FIRST_BYTE
                },
            ),
        },
        {
            "name": "envoy.filters.http.router",
            "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router"),
        },
    ]
    manager = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="fairq",
        # A queued request sends and receives nothing while it waits.
        stream_idle_timeout=timeout,
        request_timeout="0s",
        access_log=loggers,
        http_filters=http_filters,
        route_config={
            "name": "fairq",
            "virtual_hosts": [
                {
                    "name": "backends",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": "fairq_backends", "timeout": "0s"},
                        }
                    ],
                }
            ],
        },
    )
    doc: dict[str, Any] = {
        "static_resources": {
            "listeners": [
                {
                    "name": "fairq",
                    "address": _address(setup.listen),
                    # The whole body is buffered for fairq (Envoy's default: 1 MiB).
                    "per_connection_buffer_limit_bytes": setup.max_body_bytes,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        }
    }
    if setup.admin_listen:
        doc["admin"] = {"address": _address(setup.admin_listen)}
    return doc


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text not in {"true", "false", "null", "yes", "no", "on", "off"}:
        return text
    return json.dumps(text)


def to_yaml(value: object, indent: int = 0) -> str:
    """Render ``value`` (dicts, lists, scalars) as block YAML; multi-line strings literally."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            lines.extend(_entry(f"{pad}{_scalar(key)}:", item, indent))
    elif isinstance(value, list):
        for item in value:
            lines.extend(_entry(f"{pad}-", item, indent, in_list=True))
    else:
        lines.append(pad + _scalar(value))
    return "\n".join(lines) + ("\n" if indent == 0 else "")


def _entry(head: str, item: object, indent: int, *, in_list: bool = False) -> list[str]:
    if isinstance(item, str) and "\n" in item:
        body = "\n".join((" " * (indent + 2) + line) if line else "" for line in item.splitlines())
        return [f"{head} |", body]
    if isinstance(item, dict | list) and item:
        inner = to_yaml(item, indent + 2).rstrip("\n")
        if in_list and isinstance(item, dict):
            # "- key: value" with the rest of the mapping aligned under the first key.
            return [head + " " + inner.lstrip(" ")]
        return [head, inner]
    if isinstance(item, dict | list):
        return [f"{head} {'{}' if isinstance(item, dict) else '[]'}"]
    return [f"{head} {_scalar(item)}"]
