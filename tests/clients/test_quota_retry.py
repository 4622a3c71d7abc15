"""Both clients surface a quota refusal's retry delay, from a real fairq's pushback trailer."""

from __future__ import annotations

from dataclasses import replace

import pytest

import fairq
from fairq_server.config.entitlement import QuotaConfig
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend
from .test_node_client import needs_node, run_node

NODE_RETRY = """
import { createClient } from './src/client.js';
const [target, model] = process.argv.slice(1);
const client = createClient(target, { user: 'dee' });
const ask = async () => {
  for await (const event of client.generate({ model, prompt: 'hi', max_tokens: 2 })) { void event; }
};
try {
  await ask();
  await ask();
  console.log(JSON.stringify({ served: 'both' }));
} catch (err) {
  console.log(JSON.stringify({ retryable: err.retryable, retryAfterMs: err.retryAfterMs }));
} finally {
  client.close();
}
"""


async def limited(sim: SimServer, fairq_factory: FairqFactory) -> str:
    quota = QuotaConfig(user="*", requests_per_minute=1)
    server = await fairq_factory(replace(make_config([sim_backend(sim)]), quotas=(quota,)))
    return f"127.0.0.1:{server.port}"


async def test_the_python_client_raises_resource_exhausted_with_retry_after(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    target = await limited(sim, fairq_factory)
    async with fairq.AsyncClient(target, user="cy") as client:
        [e async for e in client.generate("sim", "hi", max_tokens=2)]
        with pytest.raises(fairq.ResourceExhaustedError) as info:
            [e async for e in client.generate("sim", "hi", max_tokens=2)]
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 60
    assert "requests_per_minute of user 'cy'" in str(info.value)


@needs_node
async def test_the_node_client_reports_retry_after_ms(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    target = await limited(sim, fairq_factory)
    code, lines, stderr = await run_node("--input-type=module", "-e", NODE_RETRY, target, "sim")
    assert code == 0, stderr
    (answer,) = lines
    assert answer["retryable"] is True
    assert 0 < answer["retryAfterMs"] <= 60_000
