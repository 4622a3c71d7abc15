"""deploy/kubernetes/envoy: fairq's file parses, Envoy takes its bootstrap, the pool names fairq."""

from __future__ import annotations

import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path

import yaml

from fairq_bench.envoy_process import envoy_path
from fairq_server.config.loader import parse_config
from fairq_server.config.schema import EnvoyConfig
from fairq_server.doors.extproc.bootstrap import bootstrap, to_yaml
from fairq_server.doors.extproc.command import setup_of

FOLDER = Path(__file__).parents[2] / "deploy" / "kubernetes" / "envoy"
REPLICAS = tuple(f"fairq-picker-{i}=fairq-picker-{i}.fairq-picker:9002" for i in range(3))


def documents(name: str) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all((FOLDER / name).read_text()) if d]


def test_the_envoy_bootstrap_is_fairqs_for_the_pickers_file_and_valid(tmp_path: Path) -> None:
    picker = {d["kind"]: d for d in documents("fairq-picker.yaml")}
    config = parse_config(tomllib.loads(picker["ConfigMap"]["data"]["fairq.toml"]))
    config = replace(
        config,
        envoy=EnvoyConfig(listen="0.0.0.0:8080", admin_listen="127.0.0.1:9901", replicas=REPLICAS),
    )
    envoy = {d["kind"]: d for d in documents("envoy.yaml")}
    shipped = envoy["ConfigMap"]["data"]["envoy.yaml"]
    assert shipped == to_yaml(bootstrap(setup_of(config))), "regenerate deploy/.../envoy.yaml"
    path = tmp_path / "envoy.yaml"
    path.write_text(shipped)
    binary = envoy_path()
    assert binary is not None
    checked = subprocess.run(
        [binary, "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The StatefulSet's names are the replicas the bootstrap lists.
    assert picker["StatefulSet"]["spec"]["replicas"] == len(REPLICAS)
    assert picker["StatefulSet"]["spec"]["serviceName"] == "fairq-picker"


def test_the_pool_names_fairqs_ext_proc_service_and_fails_closed() -> None:
    pool = next(d for d in documents("inferencepool.yaml") if d["kind"] == "InferencePool")
    picker = {
        d["metadata"]["name"]: d for d in documents("fairq-picker.yaml") if d["kind"] == "Service"
    }
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["failureMode"] == "FailClose"
    service = picker[ref["name"]]
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
