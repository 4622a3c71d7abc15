"""fairq's HTTP door in front of a real vLLM: the official openai SDK, tools, backend API keys,
and the flood.

fairq runs as its own process with the door on; the same requests go straight to vLLM and
through fairq. Greedy decoding (temperature 0, a seed) makes vLLM's answer a function of the
request, so any difference but latency is fairq's doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fairq_bench.processes import fairq_process, toml_config
from fairq_bench.targets import free_port

from .conftest import OTHER_CPUS
from .flood import TEST_FLOOD, run_flood
from .openai_http import completions_sender, flood_client, is_idle, wait_for_metrics
from .vllm_process import VllmProcess

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string", "maxLength": 12}},
                "required": ["word"],
            },
        },
    }
]
GREEDY = {"temperature": 0.0, "seed": 1}


@contextlib.asynccontextmanager
async def fairq_door(url: str, model: str, extra: str = "") -> AsyncIterator[str]:
    """``fairq serve`` with the HTTP door in front of ``url``; yields the door's base URL."""
    port = free_port()
    config = toml_config(url, model, "vllm", f'{extra}\n[http]\nlisten = "127.0.0.1:{port}"\n')
    async with fairq_process(config):
        yield f"http://127.0.0.1:{port}"


def clients(via: str, direct: str) -> tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]:
    return (
        openai.AsyncOpenAI(base_url=f"{via}/v1", api_key="x", max_retries=0, timeout=120),
        openai.AsyncOpenAI(base_url=f"{direct}/v1", api_key="x", max_retries=0, timeout=120),
    )


async def test_openai_sdk_same_answers_as_direct(vllm_fcfs: VllmProcess) -> None:
    model = vllm_fcfs.model
    async with fairq_door(vllm_fcfs.url, model) as door:
        via, direct = clients(door, vllm_fcfs.url)
        messages = [{"role": "user", "content": "Name a colour."}]
        for client in (via, direct):
            assert [m.id for m in (await client.models.list()).data] == [model]

        chat = [
            await c.chat.completions.create(model=model, messages=messages, max_tokens=12, **GREEDY)
            for c in (via, direct)
        ]
        assert chat[0].choices[0].message.content == chat[1].choices[0].message.content
        assert chat[0].choices[0].finish_reason == chat[1].choices[0].finish_reason
        assert chat[0].usage is not None and chat[1].usage is not None
        assert chat[0].usage.completion_tokens == chat[1].usage.completion_tokens
        assert chat[0].usage.prompt_tokens == chat[1].usage.prompt_tokens
        assert chat[0].model == chat[1].model == model

        async def streamed_chat(client: openai.AsyncOpenAI) -> tuple[str, Any]:
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=12, stream=True,
                stream_options={"include_usage": True}, **GREEDY,
            )  # fmt: skip
            text, usage = "", None
            async for chunk in stream:
                usage = chunk.usage or usage
                text += "".join(c.delta.content or "" for c in chunk.choices)
            return text, usage

        s_via, s_direct = await streamed_chat(via), await streamed_chat(direct)
        assert s_via[0] == s_direct[0] == chat[1].choices[0].message.content
        assert s_via[1].completion_tokens == s_direct[1].completion_tokens

        comp = [
            await c.completions.create(model=model, prompt="Once upon", max_tokens=10, **GREEDY)
            for c in (via, direct)
        ]
        assert comp[0].choices[0].text == comp[1].choices[0].text
        assert comp[0].usage == comp[1].usage
        stream = await via.completions.create(
            model=model, prompt="Once upon", max_tokens=10, stream=True, **GREEDY
        )
        assert "".join([c.choices[0].text async for c in stream if c.choices]) == (
            comp[1].choices[0].text
        )

        # Pass-through: logprobs come back as vLLM sends them (vLLM refuses n > 1 with greedy
        # sampling; the simulator's SDK test covers n).
        lp = [
            await c.completions.create(
                model=model, prompt="Once upon", max_tokens=4, logprobs=2, **GREEDY
            )
            for c in (via, direct)
        ]
        assert len(lp[0].choices) == len(lp[1].choices) == 1
        assert lp[0].choices[0].logprobs is not None and lp[1].choices[0].logprobs is not None
        assert lp[0].choices[0].logprobs.tokens == lp[1].choices[0].logprobs.tokens

        # The sync client, in a thread (this loop serves nothing, fairq is a process).
        def sync_round() -> tuple[str, str]:
            a = openai.OpenAI(base_url=f"{door}/v1", api_key="x", max_retries=0, timeout=120)
            b = openai.OpenAI(base_url=f"{vllm_fcfs.url}/v1", api_key="x", max_retries=0)
            kw: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 8}
            ra = a.chat.completions.create(**kw, **GREEDY)
            rb = b.chat.completions.create(**kw, **GREEDY)
            return ra.choices[0].message.content or "", rb.choices[0].message.content or ""

        got_via, got_direct = await asyncio.to_thread(sync_round)
        assert got_via == got_direct
        await via.close()
        await direct.close()


async def test_tool_call_same_as_direct(vllm_fcfs: VllmProcess) -> None:
    model = vllm_fcfs.model
    async with fairq_door(vllm_fcfs.url, model) as door:
        via, direct = clients(door, vllm_fcfs.url)
        kw: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": "Look up 'fair'."}],
            "max_tokens": 40,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            **GREEDY,
        }

        async def outcome(client: openai.AsyncOpenAI) -> tuple[str, str, str]:
            """The tool call made, or the error refusing it (vLLM started without a tool
            parser refuses a named tool_choice: the door must pass that answer on)."""
            try:
                reply = await client.chat.completions.create(**kw)
            except openai.BadRequestError as exc:
                return "refused", str(exc.status_code), exc.message
            calls = reply.choices[0].message.tool_calls or []
            assert calls, reply
            return "called", calls[0].function.name, calls[0].function.arguments

        a, b = await outcome(via), await outcome(direct)
        assert a[:2] == b[:2], (a, b)
        if a[0] == "refused":
            assert "tool-call-parser" in a[2] and "tool-call-parser" in b[2], (a, b)
        else:
            assert a[1] == "lookup" and a[2] == b[2]
        await via.close()
        await direct.close()


async def test_token_ids_and_prompt_lists_same_as_direct(vllm_fcfs: VllmProcess) -> None:
    """A token-id prompt passes through; a list is scheduled prompt by prompt and joined as
    vLLM joins it (a choice per prompt, in order; usage summed; streamed with each index)."""
    model = vllm_fcfs.model
    async with (
        fairq_door(vllm_fcfs.url, model) as door,
        httpx.AsyncClient(base_url=vllm_fcfs.url, timeout=60) as http,
    ):
        via, direct = clients(door, vllm_fcfs.url)
        tokenized = await http.post("/tokenize", json={"model": model, "prompt": "Once upon"})
        ids = tokenized.json()["tokens"]
        assert ids and all(isinstance(t, int) for t in ids)
        single = [
            await c.completions.create(model=model, prompt=ids, max_tokens=8, **GREEDY)
            for c in (via, direct)
        ]
        assert single[0].choices[0].text == single[1].choices[0].text
        assert single[0].usage == single[1].usage

        # vLLM takes a list of texts or a list of id lists, not the two mixed (fairq does).
        id_lists = [
            await c.completions.create(model=model, prompt=[ids, ids[:-1]], max_tokens=8, **GREEDY)
            for c in (via, direct)
        ]
        assert [c.text for c in id_lists[0].choices] == [c.text for c in id_lists[1].choices]
        prompts: list[Any] = ["Once upon", "Hello there", "The colour of the sky is"]
        both = [
            await c.completions.create(model=model, prompt=prompts, max_tokens=8, **GREEDY)
            for c in (via, direct)
        ]
        assert [c.index for c in both[0].choices] == [c.index for c in both[1].choices] == [0, 1, 2]
        assert [c.text for c in both[0].choices] == [c.text for c in both[1].choices]
        assert both[0].usage is not None and both[1].usage is not None
        assert both[0].usage.prompt_tokens == both[1].usage.prompt_tokens
        assert both[0].usage.completion_tokens == both[1].usage.completion_tokens

        stream = await via.completions.create(
            model=model, prompt=prompts, max_tokens=8, stream=True,
            stream_options={"include_usage": True}, **GREEDY,
        )  # fmt: skip
        texts, usage = ["", "", ""], None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                texts[choice.index] += choice.text
        assert texts == [c.text for c in both[1].choices]
        assert usage is not None and usage.total_tokens == both[1].usage.total_tokens
        await via.close()
        await direct.close()


@pytest.fixture(scope="module")
def vllm_keyed(
    vllm_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmProcess]:
    """vLLM started with ``--api-key``: every /v1 request needs the key."""
    log_path = tmp_path_factory.mktemp("vllm-keyed") / "vllm.log"
    args = ["--max-num-seqs", "4", "--api-key", "e2e-backend-key"]
    with VllmProcess(vllm_python, tiny_model_dir, log_path, extra_args=args) as server:
        yield server


async def test_fronts_a_vllm_started_with_api_key(
    vllm_keyed: VllmProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = openai.AsyncOpenAI(base_url=f"{vllm_keyed.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await direct.models.list()
    await direct.close()
    # fairq's child process inherits the variable.
    monkeypatch.setenv("FAIRQ_E2E_BACKEND_KEY", "e2e-backend-key")
    config_key = 'api_key_env = "FAIRQ_E2E_BACKEND_KEY"'
    port = free_port()
    config = toml_config(
        vllm_keyed.url, vllm_keyed.model, "vllm", f'[http]\nlisten = "127.0.0.1:{port}"\n'
    ).replace('models = ["tiny"]', f'models = ["tiny"]\n{config_key}')
    async with fairq_process(config):
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120
        )
        done = await client.chat.completions.create(
            model=vllm_keyed.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert done.usage is not None and done.usage.completion_tokens == 4
        await client.close()


async def test_flood_through_http_door(vllm_fcfs: VllmProcess) -> None:
    """The flood, twice each way (direct, door, door, direct): light user's TTFT by its mean."""
    config = TEST_FLOOD
    url, model = vllm_fcfs.url, vllm_fcfs.model
    cpus = os.sched_getaffinity(0)
    if OTHER_CPUS:
        os.sched_setaffinity(0, OTHER_CPUS)  # off vLLM's core, as the gRPC flood
    directs: list[tuple[float, float]] = []
    doors: list[tuple[float, float]] = []
    try:
        async with flood_client() as http:
            for via_door in (False, True, True, False):
                await wait_for_metrics(http, url, is_idle)
                if not via_door:
                    r = await run_flood(completions_sender(http, url, model), config)
                    directs.append((r.light_ttft_s, r.power_makespan_s))
                    continue
                async with fairq_door(url, model) as door:
                    r = await run_flood(completions_sender(http, door, model), config)
                    doors.append((r.light_ttft_s, r.power_makespan_s))
    finally:
        os.sched_setaffinity(0, cpus)
    d_ttft = statistics.fmean(r[0] for r in directs)
    h_ttft = statistics.fmean(r[0] for r in doors)
    best_d, best_h = min(r[1] for r in directs), min(r[1] for r in doors)
    print(
        f"\n[flood, HTTP door] direct: {directs}; door: {doors}\n"
        f"[flood, HTTP door] light TTFT mean {h_ttft:.3f} / {d_ttft:.3f} s = "
        f"{h_ttft / d_ttft:.3f}x; best makespans {best_h:.2f} / {best_d:.2f} s = "
        f"{best_h / best_d:.3f}x"
    )
    # vLLM alone on one core takes a flood in slowly, so fewer waves are ahead of a direct light
    # request than on a GPU host (see test_fairq_vllm's flood): the same bound as there.
    assert h_ttft <= d_ttft * 0.4, "light user not served at least 2.5x sooner via the door"
    # Best runs measured 0.977x, 1.167x and 1.214x (two floods each way, pinned engine, machine
    # shared with other jobs), where the gRPC door's flood measures 0.95-1.05x: the bound
    # catches a door that holds work back, as the simulator floods' 1.4x does.
    assert best_h <= best_d * 1.4, "power user's makespan grew by more than 40%"
