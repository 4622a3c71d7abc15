"""``fairq serve`` as a real process under a careless operator and a hostile backend: reload
files that parse but cannot be applied, and text crafted to forge lines in its log."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import grpc
import pytest

from fairq_bench.hostile_backend import HostileBackend
from fairq_bench.load import ChildProcess, start_fairq
from fairq_sim import SimServer

from .helpers import gen_request, generate, run_call, until_async

OK, INVALID = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
PROMPT_50 = "p" * 50


def _config(sim: SimServer, *, prompt_limit: int, extra: str = "") -> str:
    return (
        'listen = "127.0.0.1:0"\n'
        f"[limits]\nmax_prompt_chars = {prompt_limit}\n"
        "[scheduler]\npoll_interval_seconds = 0.05\nmax_queued_per_user = 50\n"
        f'[[backends]]\nid = "sim-a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
        + extra
    )


# Files that parse and pass the old checks but cannot be applied. Each also lowers the prompt
# limit to 10 (a half-applied reload would make a 50-character prompt INVALID_ARGUMENT) and
# the first two add a key (half-applied, every call without a key would be UNAUTHENTICATED).
UNAPPLICABLE = {
    "backend-ftp-url": (
        '[[backends]]\nid = "b"\nkind = "vllm"\nbase_url = "ftp://127.0.0.1:1"\nmodels = ["m"]\n'
        '[[keys]]\nuser = "u"\nsha256 = "' + "0" * 64 + '"\n',
        "base_url must be http(s)://host[:port]",
    ),
    "key-not-hex": ('[[keys]]\nuser = "u"\nsha256 = "' + "z" * 64 + '"\n', "64 hexadecimal"),
    "backend-id-newline": (
        '[[backends]]\nid = "b\\nFORGED"\nkind = "vllm"\nbase_url = "http://127.0.0.1:1"\n'
        'models = ["m"]\n',
        "backend id may contain only",
    ),
    "unknown-policy": ("", "scheduler.fairness 'lottery' unknown"),
    # Wrong types, which the old reader accepted: models "m" became ("m",), tiers "batch"
    # became five one-letter tiers.
    "models-a-string": (
        '[[backends]]\nid = "b"\nkind = "vllm"\nbase_url = "http://127.0.0.1:1"\nmodels = "m"\n'
        '[[keys]]\nuser = "u"\nsha256 = "' + "0" * 64 + '"\n',
        "backends[1].models: expected a list of strings, got a string ('m')",
    ),
    "key-tiers-a-string": (
        '[[keys]]\nuser = "u"\nsha256 = "' + "0" * 64 + '"\ntiers = "batch"\n',
        "keys[0].tiers: expected a list of strings, got a string ('batch')",
    ),
}


async def _prompt(child: ChildProcess, user: str = "u") -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(child.address) as ch:
        out = await run_call(
            generate(ch, gen_request(PROMPT_50, 2), metadata=(("x-fairq-user", user),), timeout=10)
        )
    return out.code


async def _log_has(child: ChildProcess, text: str) -> bool:
    return text in child.stderr_tail(100_000)


@pytest.mark.parametrize("case", sorted(UNAPPLICABLE))
async def test_sighup_with_a_file_that_cannot_be_applied_changes_nothing(
    case: str, sim: SimServer
) -> None:
    """The file is refused whole, with one log line naming the problem; the running
    configuration (limits, keys, backends) is untouched; a good file applies afterwards."""
    extra, needle = UNAPPLICABLE[case]
    child = await start_fairq(_config(sim, prompt_limit=100), log_level="INFO")
    try:
        path = Path(child.args[child.args.index("--config") + 1])
        bad = _config(sim, prompt_limit=10, extra=extra)
        if case == "unknown-policy":
            bad = bad.replace("[scheduler]\n", '[scheduler]\nfairness = "lottery"\n')
        path.write_text(bad)  # noqa: ASYNC240 - a few bytes, before the signal
        child.signal(signal.SIGHUP)
        await until_async(lambda: _log_has(child, "refused, configuration unchanged"),
                          what="reload refused")  # fmt: skip
        after_bad = await _prompt(child)
        path.write_text(_config(sim, prompt_limit=10))  # noqa: ASYNC240
        child.signal(signal.SIGHUP)
        await until_async(lambda: _log_has(child, "configuration reloaded"), what="reloaded")
        after_good = await _prompt(child)
        log = child.stderr_tail(100_000)
    finally:
        await child.stop()
    assert after_bad == OK  # the old limit (100) still holds: nothing was half-applied
    assert after_good == INVALID  # the good file applied
    assert needle in log, log
    assert "Task exception was never retrieved" not in log and "Traceback" not in log, log


async def test_shutdown_says_what_it_waits_for_and_how_long_it_took(sim: SimServer) -> None:
    """SIGTERM with --grace 30 and nothing in flight: the log promises up to 30 s for 0
    requests (not "draining for 30 s") and reports the real, much shorter, time."""
    child = await start_fairq(_config(sim, prompt_limit=100), grace=30, log_level="INFO")
    try:
        child.signal(signal.SIGTERM)
        code = await child.wait(20)
        log = child.stderr_tail(100_000)
    finally:
        await child.stop()
    assert code == 0, log
    assert "draining: up to 30 s for 0 requests in flight" in log, log
    [seconds] = re.findall(r"stopped after (\d+\.\d) s", log)
    assert float(seconds) < 10, log


async def test_nothing_a_backend_or_caller_sends_starts_a_line_in_the_log(
    sim: SimServer,
) -> None:
    """A backend's error body and stream error carrying CR/LF and a fake log line, and a
    request id with a newline: every line of fairq's stderr is one of its own records."""
    async with HostileBackend(generate="error-injection") as hostile:
        extra = (
            f'[[backends]]\nid = "bad"\nkind = "vllm"\nbase_url = "{hostile.url}"\n'
            'models = ["bad"]\n'
        )
        child = await start_fairq(_config(sim, prompt_limit=100, extra=extra), log_level="INFO")
        try:
            async with grpc.aio.insecure_channel(child.address) as ch:
                outs = [await run_call(generate(ch, gen_request(model="bad"), timeout=10))]
                hostile.generate = "event-injection"
                outs.append(await run_call(generate(ch, gen_request(model="bad"), timeout=10)))
                outs.append(
                    await run_call(
                        generate(ch, gen_request(request_id="x\n2026-01-01 ERROR FORGED id"))
                    )
                )
            await until_async(lambda: _log_has(child, "FORGED event line"), what="logged")
            log = child.stderr_tail(1_000_000)
        finally:
            await child.stop()
    assert [o.code for o in outs] == [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        INVALID,
    ], outs
    assert "FORGED http line" in log  # it was logged, escaped on the line of its record
    for line in log.splitlines():
        assert "FORGED" not in line or " fairq_server." in line.split("FORGED")[0], line
        assert not line.startswith("2026-01-01"), line
