"""Helpers shared by the simulator tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fairq_sim import (
    Engine,
    EngineConfig,
    EngineObserver,
    ManualClock,
    Profile,
    SimRequest,
    StepPlan,
    TokenOutput,
)

# Round numbers so expected step times can be written down exactly.
TEST_PROFILE = Profile(
    name="test",
    alpha=0.010,
    beta=0.001,
    gamma=0.0001,
    max_num_seqs=2,
    max_num_batched_tokens=1000,
    max_model_len=256,
    kv_blocks=64,
    block_size=4,
)


class Recorder(EngineObserver):
    """Keeps every callback for assertions."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[str, int, int]] = []
        self.preempted: list[str] = []
        self.finished: list[tuple[str, str]] = []
        self.tokens: list[TokenOutput] = []

    def on_scheduled(self, request: SimRequest, queried_tokens: int, hit_tokens: int) -> None:
        self.scheduled.append((request.request_id, queried_tokens, hit_tokens))

    def on_preempted(self, request: SimRequest) -> None:
        self.preempted.append(request.request_id)

    def on_token(self, output: TokenOutput) -> None:
        self.tokens.append(output)

    def on_finished(self, request: SimRequest) -> None:
        assert request.finish_reason is not None
        self.finished.append((request.request_id, request.finish_reason.value))


def make_engine(
    profile: Profile = TEST_PROFILE, **config: object
) -> tuple[Engine, ManualClock, Recorder]:
    clock = ManualClock()
    recorder = Recorder()
    engine = Engine(EngineConfig(profile=profile, **config), clock, recorder)  # type: ignore[arg-type]
    return engine, clock, recorder


def request(
    request_id: str, prompt_len: int, max_tokens: int, *, base: int = 1000, **kw: object
) -> SimRequest:
    """A request whose prompt is ``prompt_len`` distinct token ids starting at ``base``."""
    prompt = list(range(base, base + prompt_len))
    return SimRequest(request_id, prompt, max_tokens, **kw)  # type: ignore[arg-type]


def step(engine: Engine, clock: ManualClock) -> tuple[StepPlan, list[TokenOutput]]:
    """Run one engine step on the manual clock."""
    plan = engine.schedule()
    assert plan is not None, "nothing to schedule"
    clock.advance(plan.duration)
    return plan, engine.finish_step(plan)


def run_until_idle(engine: Engine, clock: ManualClock, max_steps: int = 100_000) -> int:
    """Step until no request is left; return the number of steps."""
    steps = 0
    while engine.has_unfinished():
        step(engine, clock)
        steps += 1
        assert steps < max_steps
    return steps


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition that other tasks (the engine loop, the server) will make true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)
