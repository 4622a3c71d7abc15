"""Configuration loading: defaults, validation with readable messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairq_server.config.loader import load_config, parse_config
from fairq_server.config.schema import ConfigError

EXAMPLE = Path(__file__).parents[2] / "examples" / "fairq.toml"


def test_example_config_loads() -> None:
    config = load_config(EXAMPLE)
    assert [t.name for t in config.tiers] == ["interactive", "standard", "batch"]
    assert config.tiers[2].max_backend_waiting == 0
    assert config.backends[0].models == ("sim",)  # what `fairq sim` serves


def test_defaults() -> None:
    config = parse_config({})
    assert [t.max_backend_waiting for t in config.tiers] == [3, 3, 0]
    assert config.scheduler.fairness == "round-robin"
    assert config.tiers[0].tpot_limit_seconds == 0.150
    assert config.scheduler.unhealthy_after_failures == 2


def test_unhealthy_after_failures_is_read() -> None:
    config = parse_config({"scheduler": {"unhealthy_after_failures": 1}})
    assert config.scheduler.unhealthy_after_failures == 1


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"scheduler": {"fairnes": "vtc"}}, "unknown keys ['fairnes']"),
        ({"bogus": 1}, "unknown top-level keys ['bogus']"),
        ({"tiers": []}, "at least one tier"),
        ({"tiers": [{"name": "a"}, {"name": "a"}]}, "duplicate names"),
        (
            {"backends": [{"id": "x", "kind": "sglang", "base_url": "http://h", "models": ["m"]}]},
            "kind 'sglang' unknown; valid: vllm, tgi, openai",
        ),
        ({"backends": [{"id": "x"}]}, "backends[0]: missing required keys ['base_url'"),
        (
            {"keys": [{"user": "u", "sha256": "0" * 64, "tiers": ["gold"]}]},
            "unknown tiers ['gold']",
        ),
        # Everything a file implies is checked at parse, so a reload is refused whole.
        (
            {"backends": [{"id": "x", "kind": "vllm", "base_url": "ftp://h", "models": ["m"]}]},
            "backends[0]: backend base_url must be http(s)://host[:port]",
        ),
        (
            {"backends": [{"id": "x y", "kind": "vllm", "base_url": "http://h", "models": ["m"]}]},
            "backends[0]: backend id may contain only",
        ),
        # An OpenAI client's base URL ends in /v1; a backend's must not (fairq adds it).
        (
            {
                "backends": [
                    {"id": "x", "kind": "vllm", "base_url": "http://h:8000/v1/", "models": ["m"]}
                ]
            },
            "backends[0]: backend base_url must not end in /v1: fairq adds /v1/... and /metrics "
            "itself; drop the /v1 ('http://h:8000', not 'http://h:8000/v1/')",
        ),
        (
            {
                "backends": [
                    {"id": "x", "kind": "openai", "base_url": "http://h/llm/v1", "models": ["m"]}
                ]
            },
            "drop the /v1 ('http://h/llm', not 'http://h/llm/v1')",
        ),
        (
            {"backends": [{"id": "x", "kind": "vllm", "base_url": "http://h", "models": []}]},
            "backends[0]: backend must serve at least one named model",
        ),
        (
            {
                "backends": [
                    {"id": "x", "kind": "vllm", "base_url": "http://h", "models": ["m" * 300]}
                ]
            },
            "backends[0]: backend model name is longer than 256",
        ),
        ({"keys": [{"user": "u", "sha256": "zz" * 32}]}, "keys[0].sha256 must be 64 hexadecimal"),
        ({"keys": [{"user": "u", "sha256": "00"}]}, "keys[0].sha256 must be 64 hexadecimal"),
        ({"keys": [{"user": "", "sha256": "0" * 64}]}, "keys[0].user must be 1-128"),
        (
            {"scheduler": {"fairness": "lottery"}},
            "scheduler.fairness 'lottery' unknown; valid: round-robin, vtc",
        ),
        ({"scheduler": {"ordering": "random"}}, "scheduler.ordering 'random' unknown"),
        ({"scheduler": {"max_metrics_bytes": 0}}, "scheduler.max_metrics_bytes must be above 0"),
        ({"scheduler": {"max_error_body_bytes": -1}}, "max_error_body_bytes must be above 0"),
        ({"scheduler": {"max_poll_backoff_seconds": 0}}, "max_poll_backoff_seconds must be"),
        ({"scheduler": {"no_backend_grace_seconds": -1}}, "no_backend_grace_seconds must be"),
        ({"limits": {"max_streams_per_connection": 0}}, "max_streams_per_connection must be"),
        ({"limits": {"request_receive_seconds": 0}}, "request_receive_seconds must be above"),
        ({"admin": {"max_backends": 0}}, "admin.max_backends must be above 0"),
        (
            {
                "admin": {"max_backends": 1},
                "backends": [
                    {"id": i, "kind": "vllm", "base_url": "http://h", "models": ["m"]}
                    for i in ("a", "b")
                ],
            },
            "2 configured; admin.max_backends is 1",
        ),
        ({"scheduler": {"unhealthy_after_failures": 0}}, "unhealthy_after_failures must be"),
        ({"scheduler": {"unhealthy_after_failures": -1}}, "integer >= 1, not -1"),
        ({"scheduler": {"unhealthy_after_failures": 1.5}}, "failures: expected an integer"),
        ({"scheduler": {"unhealthy_after_failures": True}}, "failures: expected an integer"),
        ({"scheduler": {"poll_interval_seconds": 0}}, "poll_interval_seconds must be above 0"),
        ({"scheduler": {"queue_ttl_seconds": -5}}, "queue_ttl_seconds must be above 0, not -5"),
        ({"scheduler": {"stale_after_seconds": float("nan")}}, "must be a finite number"),
        ({"scheduler": {"max_queued_total": "100"}}, "max_queued_total: expected an integer"),
        ({"scheduler": {"prefix_quantum": -1.0}}, "prefix_quantum must be 0 or more"),
        ({"scheduler": {"fairness": 3}}, "scheduler.fairness: expected a string"),
        ({"tiers": [{"name": "a", "max_backend_waiting": -1}]}, "tiers[0].max_backend_waiting"),
        ({"tiers": [{"name": "a", "kv_usage_limit": 90}]}, "is a fraction (0-1], not 90"),
        ({"tiers": [{"name": "a", "tpot_limit_seconds": 0}]}, "must be above 0"),
        ({"keys": [{"user": "u", "sha256": "00", "weight": 0}]}, "keys[0].weight must be above"),
        (
            {"keys": [{"user": "u", "sha256": "00", "admin": "yes"}]},
            "keys[0].admin: expected true or false",
        ),
        ({"limits": {"max_tokens": 1.5}}, "limits.max_tokens: expected an integer"),
        (
            {
                "backends": [
                    {
                        "id": "x",
                        "kind": "vllm",
                        "base_url": "http://h",
                        "models": ["m"],
                        "max_in_flight": -2,
                    }
                ]
            },
            "backends[0].max_in_flight must be 0 or more",
        ),
    ],
)
def test_invalid_configs_name_the_problem(raw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert needle in str(info.value)


def test_signed_and_optional_settings_keep_their_range() -> None:
    """vLLM's priority may be negative; an optional setting may be left out (None)."""
    config = parse_config(
        {"tiers": [{"name": "a", "priority": -3, "tpot_limit_seconds": 0.2, "aging_seconds": 5}]}
    )
    assert config.tiers[0].priority == -3
    assert parse_config({"tiers": [{"name": "a"}]}).tiers[0].kv_usage_limit is None
    assert (
        parse_config({"scheduler": {"poll_interval_seconds": 1}}).scheduler.poll_interval_seconds
        == 1
    )


def test_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("listen = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(path)
