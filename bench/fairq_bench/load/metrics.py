"""Reading fairq and the simulator from outside: their Prometheus ``/metrics`` endpoints."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fairq_bench.load.children import ChildProcess

__all__ = ["Samples", "fairq_quiet", "scrape", "total"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient, url: str) -> Samples:
    """Every sample of a Prometheus ``/metrics`` endpoint."""
    text = (await client.get(url, timeout=10.0)).text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


async def fairq_quiet(client: httpx.AsyncClient, fairq: ChildProcess) -> Samples:
    """fairq's metrics once nothing is queued and nothing is in flight on any backend.

    Raises:
        TimeoutError: fairq did not get there within 60 s (a leak of queue or slot state).

    """
    async with asyncio.timeout(60):
        while True:
            samples = await scrape(client, fairq.metrics_url)
            busy = total(samples, "fairq_queue_depth") + total(samples, "fairq_backend_in_flight")
            if busy == 0:
                return samples
            await asyncio.sleep(0.2)  # another process's state: nothing to await
