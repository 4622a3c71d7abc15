"""Every plugin takes its options the same way: its own table of ``[scheduler]``."""

from __future__ import annotations

import logging

import pytest

from fairq_server.config.loader import parse_config
from fairq_server.config.schema import ConfigError, SchedulerConfig
from fairq_server.scheduling.policies import Policies, check_policies
from fairq_server.scheduling.routing import PrefixAffinityRouter


def test_each_plugin_is_built_from_its_own_options_table() -> None:
    policies = Policies.from_config(SchedulerConfig(routing_options={"slack": 5}))
    assert isinstance(policies.router, PrefixAffinityRouter) and policies.router.slack == 5
    for plugin in ("fairness", "ordering", "gate", "routing"):
        config = SchedulerConfig(**{f"{plugin}_options": {"bogus": 1}})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="takes no option 'bogus'"):
            Policies.from_config(config)


def test_the_options_tables_are_read_from_the_file() -> None:
    raw = {"scheduler": {"routing_options": {"slack": 7}, "gate_options": {}}}
    config = parse_config(raw)
    assert Policies.from_config(config.scheduler).router.slack == 7  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"scheduler\.gate_options: expected a table"):
        parse_config({"scheduler": {"gate_options": 3}})
    # The options are the plugins' own: checked where the plugins are built (serve, reload,
    # the core), naming the table.
    config = parse_config(
        {"scheduler": {"routing": "least-loaded", "routing_options": {"slack": 1}}}
    )
    with pytest.raises(ConfigError, match=r"scheduler\.routing_options: .*takes no option 'slack'"):
        check_policies(config.scheduler)


def test_routing_slack_still_works_as_a_deprecated_alias(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        policies = Policies.from_config(SchedulerConfig(routing_slack=4))
    assert policies.router.slack == 4  # type: ignore[attr-defined]
    assert "routing_slack is deprecated; use scheduler.routing_options.slack" in caplog.text
    # As before the tables, a router without the option ignores the old key.
    Policies.from_config(SchedulerConfig(routing="least-loaded", routing_slack=4))
    with pytest.raises(ValueError, match="set only one"):
        Policies.from_config(SchedulerConfig(routing_slack=4, routing_options={"slack": 1}))
