"""Throughput against direct, with and without the mix's composition.

Tokens per second depend on who is served: a short answer costs an engine its prefill and
fairq's and the client's round trip for fewer tokens than a long one. Direct (FIFO) gives most
slots to the callers with the most requests outstanding; a fair share moves slots to callers
with short answers, so fewer tokens come out per second even with every slot busy. Two ratios
are therefore reported side by side:

* **tokens per second** against direct's, as measured;
* **engine efficiency** against direct's: the engine-seconds the tokens served would take at
  the engine's own rate for requests of each length, when they alone keep every slot busy
  (measured in the same run: :func:`rates`), over the seconds elapsed. It is 1 when no slot
  ever idles and the same for any composition, so its ratio is what fairq costs the engine.
"""

from __future__ import annotations

from collections.abc import Mapping

from fairq_bench.closed_loop.mixes import Caller, Mix
from fairq_bench.closed_loop.runner import DIRECT, Engine, Run, run_mix

__all__ = ["efficiency", "rates"]


async def rates(
    engine: Engine, lengths: set[int], seconds: float, warmup: float
) -> dict[int, float]:
    """Tokens per second the engine gives requests of each length keeping every slot busy."""
    out = {}
    for tokens in sorted(lengths):
        solo = Mix(f"solo-{tokens}", "", (Caller("solo", 2 * engine.slots, tokens),))
        run = await run_mix(engine, solo, DIRECT, seconds)
        out[tokens] = run.throughput(warmup)
    return out


def efficiency(run: Run, rate: Mapping[int, float], since: float) -> float:
    """Engine-seconds of the tokens served within the window, over the window's seconds."""
    tokens = run.tokens(since)
    lengths = {c.name: c.tokens for c in run.mix.callers}
    busy = sum(v / rate[lengths[name]] for name, v in tokens.items() if rate[lengths[name]] > 0)
    return busy / max(run.seconds - since, 1e-9)
