"""``[[teams]]``: weights read and checked, keys naming an unknown team refused."""

from __future__ import annotations

from typing import Any

import pytest

from fairq_server.config.loader import parse_config
from fairq_server.config.schema import ConfigError
from fairq_server.tenancy.teams import TeamWeights, team_weights

KEY = "0" * 64


def key(user: str, team: str = "") -> dict[str, Any]:
    return {"user": user, "sha256": KEY, "team": team}


def test_teams_are_read_with_their_weights() -> None:
    config = parse_config(
        {"teams": [{"name": "research", "weight": 2}, {"name": "ops"}], "keys": [key("a", "ops")]}
    )
    weights = team_weights(config.teams)
    assert weights.resolve("research") == ("research", 2.0)
    assert weights.resolve("ops") == ("ops", 1.0)
    assert weights.resolve(None) == (None, 1.0)
    assert weights.configured and "ops" in weights and weights.names() == ["research", "ops"]


def test_without_teams_a_keys_team_has_weight_one() -> None:
    config = parse_config({"keys": [key("a", "anything")]})
    assert team_weights(config.teams).resolve("anything") == ("anything", 1.0)
    assert not TeamWeights().configured


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (
            {"teams": [{"name": "ops"}], "keys": [key("a", "ops"), key("b", "opz")]},
            "keys[1].team: team 'opz' is not configured in [[teams]] (configured: 'ops')",
        ),
        ({"teams": [{"name": "ops", "weight": 0}]}, "teams[0].weight must be above 0"),
        ({"teams": [{"name": "ops", "weight": -1}]}, "teams[0].weight must be above 0"),
        ({"teams": [{"name": "ops", "weight": "2"}]}, "teams[0].weight"),
        ({"teams": [{"name": "ops"}, {"name": "ops"}]}, "teams[1]: team 'ops' is configured twice"),
        ({"teams": [{"name": ""}]}, "teams[0].name must be a non-empty string"),
        ({"teams": [{"name": "a\nb"}]}, "teams[0].name contains control characters"),
        ({"teams": [{"weight": 2}]}, "name"),
        ({"teams": [{"name": "ops", "members": ["a"]}]}, "members"),
    ],
)
def test_bad_teams_are_refused_naming_the_entry(raw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert needle in str(info.value)


def test_a_team_name_that_is_unicode_or_key_shaped_is_kept_verbatim() -> None:
    odd = "ééé sk-" + "x" * 40
    config = parse_config({"teams": [{"name": odd, "weight": 3}], "keys": [key("a", odd)]})
    assert team_weights(config.teams).weight(odd) == 3.0
