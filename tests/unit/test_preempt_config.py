"""Preemption settings in the configuration file."""

from __future__ import annotations

import tomllib

import pytest

from fairq_server.config.loader import parse_config
from fairq_server.config.schema import ConfigError

BACKEND = (
    '[[backends]]\nid = "a"\nkind = "vllm"\nbase_url = "http://127.0.0.1:8000"\nmodels = ["m"]\n'
)


def test_preemption_is_read_from_tier_backend_and_scheduler() -> None:
    text = (
        "[scheduler.preempt]\nmin_tokens = 8\nmax_per_request = 3\nmax_per_second = 1.5\n"
        '[[tiers]]\nname = "interactive"\npreempt_after_seconds = 0.2\n'
        + BACKEND
        + "preempt = true\nmax_in_flight = 8\n"
    )
    config = parse_config(tomllib.loads(text))
    assert config.tiers[0].preempt_after_seconds == 0.2
    assert config.backends[0].preempt and config.backends[0].max_in_flight == 8
    assert (config.scheduler.preempt.min_tokens, config.scheduler.preempt.max_per_request) == (8, 3)
    assert config.scheduler.preempt.max_per_second == 1.5


def test_off_by_default() -> None:
    config = parse_config(tomllib.loads(BACKEND))
    assert not config.backends[0].preempt
    assert all(t.preempt_after_seconds is None for t in config.tiers)


def test_preempt_needs_the_slot_count() -> None:
    with pytest.raises(ConfigError, match=r"backends\[0\]: preempt needs max_in_flight"):
        parse_config(tomllib.loads(BACKEND + "preempt = true\n"))


def test_wrong_types_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"scheduler\.preempt\.min_tokens"):
        parse_config(tomllib.loads('[scheduler.preempt]\nmin_tokens = "many"\n' + BACKEND))
    with pytest.raises(ConfigError, match=r"preempt_after_seconds"):
        parse_config(
            tomllib.loads('[[tiers]]\nname = "x"\npreempt_after_seconds = -1.0\n' + BACKEND)
        )
