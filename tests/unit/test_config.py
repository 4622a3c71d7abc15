"""Configuration loading: defaults, validation with readable messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairq_server.config import ConfigError, load_config, parse_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "fairq.toml"


def test_example_config_loads() -> None:
    config = load_config(EXAMPLE)
    assert [t.name for t in config.tiers] == ["interactive", "standard", "batch"]
    assert config.tiers[2].max_backend_waiting == 0
    assert config.backends[0].models == ("tiny",)


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
            "kind must be one of",
        ),
        ({"backends": [{"id": "x"}]}, "backends[0]"),
        ({"keys": [{"user": "u", "sha256": "00", "tiers": ["gold"]}]}, "unknown tiers ['gold']"),
        ({"scheduler": {"unhealthy_after_failures": 0}}, "unhealthy_after_failures must be"),
        ({"scheduler": {"unhealthy_after_failures": -1}}, "integer >= 1, not -1"),
        ({"scheduler": {"unhealthy_after_failures": 1.5}}, "unhealthy_after_failures must be"),
        ({"scheduler": {"unhealthy_after_failures": True}}, "unhealthy_after_failures must be"),
    ],
)
def test_invalid_configs_name_the_problem(raw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert needle in str(info.value)


def test_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("listen = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(path)
