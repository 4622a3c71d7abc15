"""Every deployment file opens the same doors: the configurations it ships listen on gRPC, the
OpenAI-compatible HTTP door and metrics, and the image, compose stack, Deployment and Service
expose exactly those ports."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from fairq_server.config.loader import load_config, parse_config
from fairq_server.config.schema import Config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _ports(config: Config) -> set[int]:
    return {
        int(address.rpartition(":")[2])
        for address in (config.listen, config.http.listen, config.metrics_listen)
        if address
    }


def _configmap_config() -> Config:
    configmap = yaml.safe_load((DEPLOY / "kubernetes" / "configmap.yaml").read_text())
    return parse_config(tomllib.loads(configmap["data"]["fairq.toml"]))


def test_the_shipped_configurations_turn_on_every_door() -> None:
    for config in (load_config(DEPLOY / "fairq.toml"), _configmap_config()):
        assert config.http.listen == "0.0.0.0:8080"
        assert _ports(config) == {50051, 8080, 9464}


def test_the_image_compose_and_kubernetes_expose_those_ports() -> None:
    ports = _ports(load_config(DEPLOY / "fairq.toml"))
    dockerfile = (ROOT / "Dockerfile").read_text()
    runtime = dockerfile[dockerfile.index("AS runtime") :]
    [expose] = re.findall(r"^EXPOSE (.+)$", runtime, re.MULTILINE)
    assert {int(p) for p in expose.split()} == ports

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    published = {int(p.rsplit(":", 1)[1]) for p in compose["services"]["fairq"]["ports"]}
    assert published == ports

    deployment = yaml.safe_load((DEPLOY / "kubernetes" / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert {p["containerPort"] for p in container["ports"]} == ports
    service = yaml.safe_load((DEPLOY / "kubernetes" / "service.yaml").read_text())
    assert {p["port"] for p in service["spec"]["ports"]} == ports
    names = {p["name"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == names


def test_the_manifests_no_longer_say_fairness_is_per_process() -> None:
    for path in (DEPLOY / "kubernetes" / "deployment.yaml", ROOT / "docs" / "deployment.md"):
        text = path.read_text()
        assert "fairness is per process" not in text, path
        assert "[cluster]" in text, path
