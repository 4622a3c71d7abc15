"""``[[quotas]]`` and ``[[budgets]]``: what is accepted, and the errors naming the entry."""

from __future__ import annotations

import tomllib

import pytest

from fairq_server.config.loader import parse_config
from fairq_server.errors import ConfigError

BASE = """
[[backends]]
id = "a"
kind = "vllm"
base_url = "http://127.0.0.1:8000"
models = ["llama", "free"]

[prices.llama]
input_per_million = 0.5
output_per_million = 1.5

[[teams]]
name = "research"
"""


def parse(extra: str) -> object:
    return parse_config(tomllib.loads(BASE + extra))


def test_a_full_configuration_is_read() -> None:
    config = parse_config(
        tomllib.loads(
            BASE
            + """
[[quotas]]
team = "research"
tokens_per_minute = 50000
mode = "soft"

[[quotas]]
user = "*"
requests_per_minute = 60

[[quotas]]
user = "änn ☃ sk-0123456789abcdef"
model = "llama"
tokens_per_day = 1000000

[[budgets]]
team = "research"
per_day = 10.0
per_month = 200

[[budgets]]
user = "ann"
model = "llama"
per_month = 5.5
mode = "soft"
"""
        )
    )
    assert [q.mode for q in config.quotas] == ["soft", "hard", "hard"]
    assert config.quotas[2].user == "änn ☃ sk-0123456789abcdef"
    assert config.budgets[0].per_month == 200
    assert config.budgets[1].model == "llama"


Q = "[[quotas]]\nuser = 'a'\n"
B = "[[budgets]]\nuser = 'a'\n"
BAD = [
    (Q + "tokens_per_minute = 0", "quotas[0].tokens_per_minute must be above 0"),
    (Q + "requests_per_minute = -1", "quotas[0].requests_per_minute must be above 0"),
    (Q + "tokens_per_minute = 1.5", "quotas[0].tokens_per_minute: expected an integer"),
    (Q + "tokens_per_minute = '5'", "expected an integer, got a string"),
    (Q + "tokens_per_minut = 5", "quotas[0]: unknown keys ['tokens_per_minut']"),
    (Q, "quotas[0]: no limit given"),
    ("[[quotas]]\ntokens_per_day = 5", "quotas[0]: give exactly one of team and user"),
    (Q + "team = 'research'\ntokens_per_day = 5", "exactly one of team and user"),
    ("[[quotas]]\nteam = 'reserch'\ntokens_per_day = 5", "team 'reserch' is not configured"),
    (Q + "tokens_per_day = 5\nmode = 'strict'", "quotas[0].mode must be 'hard' or 'soft'"),
    ('[[quotas]]\nuser = "a\\u0007"\ntokens_per_day = 5', "quotas[0].user"),
    (Q + "tokens_per_day = 5\n" + Q + "tokens_per_minute = 5", "quotas[1]: user 'a' already"),
    ("[quotas]\nuser = 'a'", "quotas: expected an array of tables"),
    (B + "per_day = 0.0", "budgets[0].per_day must be above 0"),
    (B + "per_day = nan", "budgets[0].per_day must be a finite number"),
    (B + "model = 'gpt'\nper_day = 1", "budgets[0].model: no configured backend serves"),
    (B + "model = 'free'\nper_day = 1", "model 'free' has no [prices.free] table"),
]


@pytest.mark.parametrize(("extra", "message"), BAD)
def test_bad_entries_are_refused_naming_the_entry(extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(extra)
    assert message in str(info.value)


def test_a_budget_without_any_price_is_refused() -> None:
    text = BASE.replace("[prices.llama]\ninput_per_million = 0.5\noutput_per_million = 1.5\n", "")
    with pytest.raises(ConfigError, match=r"budgets\[0\]: a budget counts cost, and no \[prices"):
        parse_config(tomllib.loads(text + "[[budgets]]\nuser = 'a'\nper_day = 1"))


def test_without_teams_any_team_name_may_be_limited() -> None:
    text = BASE.replace('[[teams]]\nname = "research"\n', "")
    config = parse_config(tomllib.loads(text + "[[quotas]]\nteam = 'ops'\ntokens_per_day = 5"))
    assert config.quotas[0].team == "ops"
