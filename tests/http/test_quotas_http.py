"""Hard quotas and budgets at the HTTP door: 429 with Retry-After and an OpenAI-style body."""

from __future__ import annotations

import math
from dataclasses import replace

import openai
import pytest

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.prices import PriceConfig
from fairq_server.config.schema import HttpConfig
from fairq_sim import SimServer

from ..api.test_quotas import Clock, entitlement
from ..conftest import FairqFactory, make_config, sim_backend
from .test_door import CHAT, post


async def test_hard_tokens_per_minute_answers_429_with_retry_after(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = replace(
        make_config([sim_backend(sim)]),
        http=HttpConfig(listen="127.0.0.1:0"),
        quotas=(QuotaConfig(user="ann", tokens_per_minute=10),),
    )
    server = await fairq_factory(config)
    clock = Clock()
    entitlement(server).clock = clock
    url = f"http://127.0.0.1:{server.http_port}/v1/chat/completions"
    ann = {"x-fairq-user": "ann"}
    status, _, doc = await post(url, CHAT, ann)
    assert status == 200, doc
    clock.now += 15.5
    for body in (CHAT, {**CHAT, "stream": True}):
        status, headers, doc = await post(url, body, ann)
        assert status == 429
        assert headers["Retry-After"] == "45"  # 44.5 s, rounded up
        error = doc["error"]
        assert error["type"] == "rate_limit_exceeded"
        assert error["code"] == "rate_limit_exceeded"
        assert "tokens_per_minute of user 'ann'" in error["message"]
        assert "retry in 45 s" in error["message"]
    status, _, _ = await post(url, CHAT, {"x-fairq-user": "bob"})
    assert status == 200
    clock.now += 45
    status, _, _ = await post(url, CHAT, ann)
    assert status == 200


async def test_the_openai_sdk_sees_a_rate_limit_error(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = replace(
        make_config([sim_backend(sim)]),
        http=HttpConfig(listen="127.0.0.1:0"),
        quotas=(QuotaConfig(user="*", requests_per_minute=1),),
    )
    server = await fairq_factory(config)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0
    )
    await client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2, user="cy")  # fmt: skip
    try:
        await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="cy"
        )
    except openai.RateLimitError as exc:
        assert exc.code == "rate_limit_exceeded"
        assert 1 <= int(exc.response.headers["retry-after"]) <= 60
    else:
        raise AssertionError("the second request of the minute was served")
    await client.close()


async def test_a_hard_budget_refuses_in_price_units_and_warns_at_80_percent(
    sim: SimServer, fairq_factory: FairqFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # 1000 cost units per million tokens in and out: a request of p + c tokens costs
    # (p + c) / 1000. The daily budget is a few requests' worth.
    config = replace(
        make_config([sim_backend(sim)]),
        http=HttpConfig(listen="127.0.0.1:0"),
        prices={"sim": PriceConfig(input_per_million=1000.0, output_per_million=1000.0)},
        budgets=(BudgetConfig(team="", user="ann", per_day=0.05),),
    )
    server = await fairq_factory(config)
    clock = Clock()
    entitlement(server).clock = clock
    url = f"http://127.0.0.1:{server.http_port}/v1/chat/completions"
    ann = {"x-fairq-user": "ann"}
    registry = server.core.telemetry.registry
    warnings = {"kind": "budget_per_day", "scope": "user"}
    served = 0
    while True:
        status, headers, doc = await post(url, CHAT, ann)
        if status != 200:
            break
        served += 1
        assert served < 20
    assert status == 429
    assert "budget_per_day of user 'ann'" in doc["error"]["message"]
    midnight = (clock.now // 86400 + 1) * 86400
    assert int(headers["Retry-After"]) == math.ceil(midnight - clock.now)
    assert served >= 2
    # One warning for the key and day, however many requests passed 80 %.
    assert registry.get_sample_value("fairq_limit_warnings_total", warnings) == 1.0
    lines = [r.getMessage() for r in caplog.records if "of its limit" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("hard budget_per_day of user 'ann' (budgets[0]) at ")
    refusals = {"kind": "budget_per_day", "scope": "user"}
    assert registry.get_sample_value("fairq_limit_refusals_total", refusals) == 1.0
