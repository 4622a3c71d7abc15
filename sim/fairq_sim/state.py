"""Per-app state shared by the HTTP handlers of one simulated backend."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Protocol

from fairq_sim.config import SimConfig
from fairq_sim.engine import Engine, EngineConfig
from fairq_sim.events import EngineObserver
from fairq_sim.profiles import Profile
from fairq_sim.runner import EngineRunner
from fairq_sim.sglang_metrics import SglangMetrics
from fairq_sim.tgi_metrics import TgiMetrics
from fairq_sim.tokens import mix64
from fairq_sim.vllm_metrics import VllmMetrics

__all__ = ["MetricsExporter", "SimState"]


class MetricsExporter(Protocol):
    """Renders ``/metrics`` for one backend flavour."""

    content_type: str

    def render(self) -> bytes:
        """Return the exposition text."""
        ...


class SimState:
    """Engine, runner, metrics and fault bookkeeping of one app.

    Args:
        config: The simulator configuration (validated here).

    """

    def __init__(self, config: SimConfig) -> None:
        config.validate()
        self.config = config
        self.profile: Profile = config.resolved_profile()
        self.vllm_metrics: VllmMetrics | None = None
        self.tgi_metrics: TgiMetrics | None = None
        self.sglang_metrics: SglangMetrics | None = None
        self.metrics: MetricsExporter
        observer: EngineObserver
        if config.mode == "sglang":
            sglang_metrics = SglangMetrics(config.model)
            self.sglang_metrics = sglang_metrics
            self.metrics = observer = sglang_metrics
        elif config.mode == "vllm":
            vllm_metrics = VllmMetrics(config.model, self.profile)
            self.vllm_metrics = vllm_metrics
            self.metrics = observer = vllm_metrics
        else:
            tgi_metrics = TgiMetrics(self.max_input_tokens, self.profile.max_model_len)
            self.tgi_metrics = tgi_metrics
            self.metrics = observer = tgi_metrics
        engine_config = EngineConfig(
            profile=self.profile,
            speed=config.speed,
            policy="priority" if config.priority_mode else "fcfs",
            eos_mean_tokens=config.eos_mean_tokens,
            seed=config.seed,
        )
        self.engine = Engine(engine_config, time.monotonic, observer)
        if self.vllm_metrics is not None:
            self.vllm_metrics.bind(self.engine)
        if self.tgi_metrics is not None:
            self.tgi_metrics.bind(self.engine)
        if self.sglang_metrics is not None:
            self.sglang_metrics.bind(self.engine)
        self.runner = EngineRunner(self.engine, speed=lambda: config.speed)
        self.started = asyncio.Event()
        self.created = int(time.time())
        self._ready_at = 0.0
        self._ids = itertools.count()
        self._fault_rng = random.Random(config.seed)
        self.in_flight = 0

    @property
    def max_input_tokens(self) -> int:
        """Longest accepted prompt (TGI's ``max_input_tokens``)."""
        return self.profile.max_model_len - 1

    async def startup(self) -> None:
        """Start the engine loop; the slow-start fault counts from here."""
        self._ready_at = time.monotonic() + self.config.startup_delay
        self.runner.start()
        self.started.set()

    async def shutdown(self) -> None:
        """Stop the engine loop, ending every open stream."""
        await self.runner.stop()

    def ready(self) -> bool:
        """Whether the slow-start delay has passed."""
        return self.started.is_set() and time.monotonic() >= self._ready_at

    def next_number(self) -> int:
        """Return a fresh per-app sequence number (ids, default seeds)."""
        return next(self._ids)

    def default_seed(self, number: int) -> int:
        """Return the text seed for request ``number`` when the client gave none."""
        return mix64(self.config.seed, number)

    def inject_error(self) -> bool:
        """Decide whether this request gets the error-rate fault (seeded, reproducible)."""
        rate = self.config.error_rate
        return rate > 0 and self._fault_rng.random() < rate
