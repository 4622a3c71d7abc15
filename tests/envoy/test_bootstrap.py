"""``fairq envoy bootstrap --config FILE``: a bootstrap Envoy accepts, for the file's setup."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fairq_bench.envoy_process import envoy_path
from fairq_server.doors.extproc.command import main

CONFIG = """
[extproc]
listen = "0.0.0.0:9002"

[envoy]
listen = "0.0.0.0:8080"
admin_listen = "127.0.0.1:9901"

[scheduler]
queue_ttl_seconds = 120

[[backends]]
id = "vllm-a"
kind = "vllm"
base_url = "http://10.0.0.5:8000"
models = ["llama"]
"""


def test_the_bootstrap_is_valid_and_names_fairq_and_the_original_destination(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fairq.toml"
    config.write_text(CONFIG)
    assert main(["bootstrap", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "x-gateway-destination-endpoint" in text
    assert "ORIGINAL_DST" in text
    assert "port_value: 9002" in text
    assert "status_on_error" in text
    assert "125.000s" in text  # the queue's TTL and a margin
    out = tmp_path / "envoy.yaml"
    out.write_text(text)
    binary = envoy_path()
    assert binary is not None
    checked = subprocess.run(
        [binary, "--mode", "validate", "-c", str(out), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_replicas_are_named_in_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fairq.toml"
    config.write_text(
        CONFIG.replace(
            'admin_listen = "127.0.0.1:9901"',
            'replicas = ["fairq-0=fairq-0.fairq:9002", "fairq-1=fairq-1.fairq:9002"]',
        )
    )
    assert main(["bootstrap", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "fairq_fairq_0" in text and "fairq_fairq_1" in text
    assert "exact: fairq-1" in text
    config.write_text(CONFIG.replace('admin_listen = "127.0.0.1:9901"', 'replicas = ["nope"]'))
    assert main(["bootstrap", "--config", str(config)]) == 2
