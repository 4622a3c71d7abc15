"""Shared set-up of the scenarios: simulator sizing, fairq configurations, and runs.

Every scenario runs the simulator with ``--speed S``: each engine step takes 1/S of its
modelled time, so a minute of simulated traffic takes 60/S seconds. Arrival times, fairq's
polling interval, time-per-output-token limits and aging bounds are divided by S too, and
measured times multiplied by S, so every figure in the reports is in *simulated* seconds and
does not depend on S (as long as the machine keeps up; each report shows the achieved
throughput next to the model's capacity as a check).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from fairq_bench.processes import fairq_module_process, sim_process
from fairq_bench.scenarios.tracing import Trace, trace_replay
from fairq_bench.targets import direct_sender, fairq_sender, http_client, keyed_sender
from fairq_bench.workload import RequestSpec
from fairq_server.identity.auth import hash_key
from fairq_sim.profiles import PROFILES

__all__ = [
    "MODEL",
    "FairqSetup",
    "SimSetup",
    "Tier",
    "api_key",
    "run_direct",
    "run_fairq",
]

MODEL = "sim"


@dataclass(frozen=True)
class SimSetup:
    """How a scenario's simulated backend is started.

    Attributes:
        profile: simulator profile.
        max_num_seqs: batch size.
        speed: clock factor S.
        extra: further ``fairq sim`` arguments (KV size, policy).

    """

    profile: str = "llama-8b-gpu"
    max_num_seqs: int = 16
    speed: float = 1.0
    extra: tuple[str, ...] = ()

    def args(self) -> list[str]:
        """``fairq sim`` arguments."""
        return [
            "--profile", self.profile, "--max-num-seqs", str(self.max_num_seqs),
            "--speed", f"{self.speed:g}", *self.extra,
        ]  # fmt: skip

    def capacity(self, mean_prompt: float, mean_output: float, batch: int | None = None) -> float:
        """Requests per simulated second the engine completes when every slot is busy.

        From the profile's step-time model: each request decodes ``mean_output`` steps in a
        batch of ``batch`` (default: ``max_num_seqs``) and adds its prefill to one step.
        """
        p = PROFILES[self.profile]
        b = batch or self.max_num_seqs
        per_request = mean_output * (p.alpha + p.beta * b) / b + mean_prompt * p.gamma
        return 1.0 / per_request

    @contextlib.asynccontextmanager
    async def start(self) -> AsyncIterator[str]:
        """Start a fresh simulator; yield its URL."""
        async with sim_process(*self.args()) as url:
            yield url


@dataclass(frozen=True)
class Tier:
    """A tier of the fairq configuration, with times in simulated seconds."""

    name: str
    max_backend_waiting: int = 3
    tpot_limit: float | None = 0.150
    aging: float | None = None
    #: Forward this tier only while the backend has fewer requests in flight (0 = no cap).
    max_backend_in_flight: int = 0


def api_key(user: str) -> str:
    """The benchmark's API key of ``user``."""
    return f"bench-key-{user}"


@dataclass(frozen=True)
class FairqSetup:
    """A fairq configuration for one run.

    Attributes:
        fairness: ``round-robin`` or ``vtc`` (options go in ``scheduler``).
        tiers: tiers in strict order.
        weights: if set, API keys are configured for these users with these weights and
            requests carry the key; otherwise open mode (every user weight 1).
        scheduler: further ``[scheduler]`` settings, verbatim TOML values.
        module: how to start fairq (``-m fairq_server`` or a wrapper module).
        backend: further ``[[backends]]`` settings, verbatim TOML values.

    """

    fairness: str = "vtc"
    tiers: tuple[Tier, ...] = (Tier("standard"),)
    weights: dict[str, float] = field(default_factory=dict)
    scheduler: dict[str, str] = field(default_factory=dict)
    module: tuple[str, ...] = ("-m", "fairq_server")
    backend: dict[str, str] = field(default_factory=dict)

    def toml(self, url: str, speed: float) -> str:
        """The configuration text for a backend at ``url`` running at clock factor ``speed``."""
        # Scrapes every 0.1 simulated s, but not more often than 50 per wall second: a
        # scrape costs the simulator a few milliseconds of CPU.
        sched = {
            "fairness": f'"{self.fairness}"',
            "poll_interval_seconds": f"{max(0.1 / speed, 0.02):g}",
            **self.scheduler,
        }
        lines = ['listen = "127.0.0.1:0"', "[scheduler]"]
        lines += [f"{k} = {v}" for k, v in sched.items()]
        for tier in self.tiers:
            lines += ["[[tiers]]", f'name = "{tier.name}"']
            lines.append(f"max_backend_waiting = {tier.max_backend_waiting}")
            # TOML has no null: "no TPOT limit" is a limit no backend reaches.
            tpot = 1e6 if tier.tpot_limit is None else tier.tpot_limit / speed
            lines.append(f"tpot_limit_seconds = {tpot:g}")
            if tier.aging is not None:
                lines.append(f"aging_seconds = {tier.aging / speed:g}")
            if tier.max_backend_in_flight:
                lines.append(f"max_backend_in_flight = {tier.max_backend_in_flight}")
        names = ", ".join(f'"{t.name}"' for t in self.tiers)
        for user, weight in self.weights.items():
            lines += [
                "[[keys]]", f'user = "{user}"', f'sha256 = "{hash_key(api_key(user))}"',
                f"tiers = [{names}]", f"weight = {weight:g}",
            ]  # fmt: skip
        lines += [
            "[[backends]]", 'id = "backend-0"', 'kind = "vllm"', f'base_url = "{url}"',
            f'models = ["{MODEL}"]',
        ]  # fmt: skip
        lines += [f"{k} = {v}" for k, v in self.backend.items()]
        return "\n".join(lines) + "\n"


async def run_direct(
    url: str, specs: Sequence[RequestSpec], stop_at: float | None = None
) -> list[Trace]:
    """Replay ``specs`` straight to the backend (its own FIFO queue)."""
    async with http_client() as client:
        return await trace_replay(specs, direct_sender(client, url, MODEL, "vllm"), stop_at=stop_at)


async def run_fairq(
    url: str,
    setup: FairqSetup,
    specs: Sequence[RequestSpec],
    speed: float,
    stop_at: float | None = None,
) -> list[Trace]:
    """Replay ``specs`` through a fresh fairq process configured by ``setup``."""
    config = setup.toml(url, speed)
    async with (
        fairq_module_process(config, setup.module) as (_, target),
        grpc.aio.insecure_channel(target) as channel,
    ):
        if setup.weights:
            send = keyed_sender(channel, MODEL, {u: api_key(u) for u in setup.weights})
        else:
            send = fairq_sender(channel, MODEL)
        return await trace_replay(specs, send, stop_at=stop_at)
