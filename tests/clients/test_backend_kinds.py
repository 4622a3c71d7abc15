"""The server's and both clients' backend kinds are the proto's ``BackendKind`` enum (CI).

The enum is read from ``protos/fairq/v1/admin.proto`` itself, compiled here by
protoc, not from the generated stubs the Python client imports: stale stubs,
or a stale copy of the protos inside the Node package, fail this test.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

import fairq
from fairq_server.backends.kinds import BACKEND_KINDS as SERVER_KINDS

from .test_node_client import NODE, NODE_DIR, needs_node

PROTOS = Path(__file__).resolve().parents[2] / "protos"


def proto_kinds(tmp_path: Path) -> list[str]:
    """The BackendKind values of admin.proto, prefix dropped, lower case, UNSPECIFIED left out."""
    out = tmp_path / "admin.binpb"
    status = protoc.main(
        ["protoc", f"-I{PROTOS}", f"--descriptor_set_out={out}", "fairq/v1/admin.proto"]
    )
    assert status == 0, "protoc could not compile admin.proto"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (enum,) = [e for f in files.file for e in f.enum_type if e.name == "BackendKind"]
    return [
        v.name.removeprefix("BACKEND_KIND_").lower()
        for v in sorted(enum.value, key=lambda v: v.number)
        if v.number != 0
    ]


def test_the_enum_has_the_kinds_the_clients_document(tmp_path: Path) -> None:
    # Guards the reading itself: if this broke, the comparisons below would be empty.
    assert {"vllm", "tgi", "openai"} <= set(proto_kinds(tmp_path))


def test_python_client_kinds_are_the_protos(tmp_path: Path) -> None:
    assert list(fairq.BACKEND_KINDS) == proto_kinds(tmp_path)


def test_server_drives_exactly_the_protos_kinds(tmp_path: Path) -> None:
    # A kind added to the proto without an adapter (or the reverse) fails here, not at an
    # operator's RegisterBackend.
    assert sorted(SERVER_KINDS) == sorted(proto_kinds(tmp_path))


@needs_node
def test_node_client_kinds_are_the_protos(tmp_path: Path) -> None:
    assert NODE is not None
    script = "import('./src/client.js').then((m) => console.log(JSON.stringify(m.BACKEND_KINDS)))"
    result = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == proto_kinds(tmp_path), (
        "the Node package's copy of the protos differs: run `node scripts/copy-protos.js`"
    )
