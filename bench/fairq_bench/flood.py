"""The power-user flood: the story fairq exists for, direct FIFO vs fairq in one run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from fairq_bench.processes import fairq_process, toml_config
from fairq_bench.report import Progress, RunSummary, markdown_table, summarize
from fairq_bench.targets import (
    aiohttp_session,
    direct_sender,
    fairq_sender,
    free_port,
    http_client,
    openai_sender,
)
from fairq_bench.workload import RequestResult, RequestSpec, replay

__all__ = ["FloodComparison", "compare_flood", "flood_workload"]

POWER = "power-user"
LIGHT = "light-user"


def flood_workload(
    *,
    power_requests: int = 60,
    power_tokens: int = 300,
    light_requests: int = 1,
    light_tokens: int = 16,
    light_start: float = 0.5,
    light_every: float = 1.0,
) -> list[RequestSpec]:
    """One user sends ``power_requests`` long requests at once; another, a few short ones later."""
    specs = [
        RequestSpec(POWER, f"Write a long report on fair queueing, part {i}.", power_tokens)
        for i in range(power_requests)
    ]
    specs += [
        RequestSpec(LIGHT, f"Short question {i}?", light_tokens, at=light_start + i * light_every)
        for i in range(light_requests)
    ]
    return specs


@dataclass(frozen=True)
class FloodComparison:
    """Results of the same workload sent directly and through fairq."""

    direct: list[RequestResult]
    fairq: list[RequestResult]

    def summaries(self) -> list[RunSummary]:
        """Light user and power user, direct then fairq."""
        out = []
        for label, results in (("direct", self.direct), ("fairq", self.fairq)):
            out.append(summarize(f"{label} light", results, lambda u: u == LIGHT))
            out.append(summarize(f"{label} power", results, lambda u: u == POWER))
            out.append(summarize(f"{label} all", results))
        return out

    def ratios(self) -> dict[str, float]:
        """fairq / direct for the headline figures (lower is better for times)."""
        s = {x.label: x for x in self.summaries()}
        return {
            "light_ttft_p50": s["fairq light"].ttft_p50 / s["direct light"].ttft_p50,
            "light_ttft_max": s["fairq light"].ttft_max / s["direct light"].ttft_max,
            "power_makespan": s["fairq power"].makespan / s["direct power"].makespan,
            "throughput": s["fairq all"].tokens_per_second / s["direct all"].tokens_per_second,
        }

    def table(self) -> str:
        """Markdown table of both runs side by side, with the fairq/direct ratio."""
        s = {x.label: x for x in self.summaries()}
        rows: list[Sequence[object]] = []
        for name, attr, group in (
            ("light-user TTFT p50 (s)", "ttft_p50", "light"),
            ("light-user TTFT max (s)", "ttft_max", "light"),
            ("power-user makespan (s)", "makespan", "power"),
            ("backend throughput (tokens/s)", "tokens_per_second", "all"),
            ("failed requests", "errors", "all"),
        ):
            d = getattr(s[f"direct {group}"], attr)
            f = getattr(s[f"fairq {group}"], attr)
            ratio = f / d if isinstance(d, float) and d else ""
            rows.append((name, d, f, f"{ratio:.3f}x" if ratio != "" else "-"))
        return markdown_table(("metric", "direct (FIFO)", "through fairq", "fairq / direct"), rows)


async def compare_flood(
    backend_url: str,
    model: str,
    kind: str,
    specs: Sequence[RequestSpec],
    *,
    fairq_extra_config: str = "",
    show_progress: bool = True,
    door: str = "grpc",
) -> FloodComparison:
    """Replay ``specs`` straight to the backend, then through a fresh ``fairq serve``.

    ``door`` is ``grpc`` (fairq's client), ``http`` (OpenAI ``/v1/completions`` on fairq's
    HTTP door, the user named by the body's ``user`` field) or ``mixed`` (the light users
    through the HTTP door, everyone else through gRPC: one queue for both doors), or
    ``envoy`` (the HTTP door's requests through an Envoy with fairq as its ext_proc picker).
    """
    total = len(specs)
    async with http_client() as client, aiohttp_session() as session:
        # Through the HTTP door both sides use the same HTTP client, so its cost per event
        # (every SSE event is parsed) is the same on both sides.
        sender = (
            openai_sender(session, backend_url, model)
            if door in ("http", "envoy")
            else direct_sender(client, backend_url, model, kind)
        )
        direct = await replay(
            specs,
            sender,
            on_done=Progress("direct to backend", total) if show_progress else None,
        )
    http_port = free_port() if door != "grpc" else 0
    extra = fairq_extra_config
    if http_port:
        extra = f'{extra}\n[http]\nlisten = "127.0.0.1:{http_port}"\n'
    extproc = f"127.0.0.1:{free_port()}" if door == "envoy" else ""
    if extproc:
        extra = f'{extra}\n[extproc]\nlisten = "{extproc}"\n'
    config = toml_config(backend_url, model, kind, extra)
    progress = Progress(f"through fairq ({door})", total) if show_progress else None
    async with (
        fairq_process(config) as target,
        grpc.aio.insecure_channel(target) as channel,
        aiohttp_session() as session,
        _envoy(extproc) as envoy_url,
    ):
        via_grpc = fairq_sender(channel, model)
        http_url = envoy_url or f"http://127.0.0.1:{http_port}"
        via_http = openai_sender(session, http_url, model, with_user=True)

        def send(spec: RequestSpec) -> AsyncIterator[str]:
            if door in ("http", "envoy") or (door == "mixed" and spec.user.startswith("light")):
                return via_http(spec)
            return via_grpc(spec)

        through = await replay(specs, send, on_done=progress)
    return FloodComparison(direct, through)


@contextlib.asynccontextmanager
async def _envoy(extproc: str) -> AsyncIterator[str]:
    """An Envoy before fairq's ext_proc door at ``extproc`` (its URL; nothing and "" if "")."""
    if not extproc:
        yield ""
        return
    from fairq_bench.envoy_process import EnvoyProcess

    envoy = EnvoyProcess([("fairq", extproc)])
    await asyncio.to_thread(envoy.start)
    try:
        yield envoy.url
    finally:
        await asyncio.to_thread(envoy.close)
