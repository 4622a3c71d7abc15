"""TGI mode: reading bodies, admitting requests, and the per-request job both APIs share.

TGI's router checks, in order: the JSON body (axum answers plain-text 400/422 itself), the
concurrency limit (``overloaded``), then parameter validation. A request that passes holds a
concurrency permit until its response ends; :class:`Job` releases it exactly once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

from starlette.requests import Request

from fairq_sim.events import TokenOutput
from fairq_sim.request import SimRequest
from fairq_sim.runner import EngineClosedError, RequestStream
from fairq_sim.state import SimState
from fairq_sim.tgi_protocol import (
    GenerateParams,
    TgiError,
    overloaded,
    parse_parameters,
    token_json,
    validation_error,
)
from fairq_sim.tokens import EOS_TOKEN_ID, token_logprob, token_text, tokenize

__all__ = [
    "KEEP_ALIVE_SECONDS",
    "BodyRejected",
    "Job",
    "admit",
    "count_failure",
    "incomplete",
    "read_body",
    "state_of",
    "stream_headers",
]

KEEP_ALIVE_SECONDS = 15.0


def incomplete() -> TgiError:
    """Return TGI's 500 ``incomplete_generation`` error (also the error-rate fault)."""
    return TgiError(500, "incomplete_generation", "Incomplete generation", "incomplete")


class BodyRejected(Exception):
    """axum's JSON extractor refused the body: plain-text 400 or 422."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def state_of(request: Request) -> SimState:
    """Return the app's :class:`SimState`."""
    state: SimState = request.app.state.sim
    return state


async def read_body(request: Request, required: str) -> dict[str, Any]:
    """Return the JSON body, rejected as axum's extractor would.

    Raises:
        BodyRejected: Plain-text 400 for bad JSON, 422 for a missing field or wrong type.

    """
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BodyRejected(400, f"Failed to parse the request body as JSON: {exc}") from exc
    problem = None
    if not isinstance(body, dict):
        problem = "invalid type: expected a JSON object"
    elif required not in body:
        problem = f"missing field `{required}`"
    elif not isinstance(body.get("parameters", {}) or {}, dict):
        problem = "parameters: invalid type: expected struct GenerateParameters"
    else:
        params = body.get("parameters") or {}
        for key in ("max_new_tokens", "seed", "top_k", "temperature", "top_p"):
            value = params.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                problem = f"parameters.{key}: invalid type: {value!r}, expected a number"
    if problem is not None:
        raise BodyRejected(
            422, f"Failed to deserialize the JSON body into the target type: {problem}"
        )
    return cast(dict[str, Any], body)


class Job:
    """One admitted generation: its engine stream and the bookkeeping to undo."""

    def __init__(self, state: SimState, params: GenerateParams, stream: RequestStream) -> None:
        self.state = state
        self.params = params
        self.stream = stream
        self.closed = False

    def close(self) -> None:
        """Release the concurrency slot; abort the engine request if unfinished."""
        if self.closed:
            return
        self.closed = True
        self.state.in_flight -= 1
        if not self.stream.done:
            self.state.runner.abort(self.stream.request.request_id)

    async def outputs(self) -> AsyncIterator[tuple[int, dict[str, Any], bool]]:
        """Yield ``(index, token, finished)``; ``index`` 0 means a keep-alive tick."""
        request = self.stream.request
        index = 0
        while not self.stream.done:
            try:
                output = await _wait(self.stream, KEEP_ALIVE_SECONDS)
            except TimeoutError:
                yield 0, {}, False
                continue
            index += 1
            special = output.token_id == EOS_TOKEN_ID
            text = token_text(output.token_id, skip_special=False)
            logprob = token_logprob(request.seed, index - 1)
            yield index, token_json(output.token_id, text, logprob, special), output.finished

    def generated_text(self, prompt: str) -> str:
        """Return the output text (special tokens skipped), with the prompt if asked."""
        text = self.stream.request.output_text
        return prompt + text if self.params.return_full_text else text


async def _wait(stream: RequestStream, timeout: float) -> TokenOutput:
    async with asyncio.timeout(timeout):
        return await stream.get()


def admit(state: SimState, inputs: str, parameters: dict[str, Any] | None, compat: bool) -> Job:
    """Validate and queue a request as TGI's ``Infer`` does; raises :class:`TgiError`."""
    metrics = state.tgi_metrics
    assert metrics is not None
    if state.in_flight >= state.config.max_concurrent_requests:
        raise overloaded()
    if not inputs:
        raise validation_error("`inputs` cannot be empty")
    input_ids = tokenize(inputs)
    params = parse_parameters(
        parameters,
        len(input_ids),
        state.max_input_tokens,
        state.profile.max_model_len,
        default_full_text=compat,
    )
    metrics.observe("tgi_request_input_length", float(params.input_length))
    metrics.observe("tgi_request_max_new_tokens", float(params.max_new_tokens))
    number = state.next_number()
    sim_request = SimRequest(
        request_id=f"tgi-{number}",
        prompt_token_ids=input_ids,
        max_tokens=params.max_new_tokens,
        stop=params.stop,
        seed=params.seed if params.seed is not None else state.default_seed(number),
    )
    try:
        stream = state.runner.submit(sim_request)
    except EngineClosedError as exc:
        raise incomplete() from exc
    state.in_flight += 1
    return Job(state, params, stream)


def count_failure(state: SimState, error: TgiError) -> TgiError:
    """Count ``error`` in ``tgi_request_failure`` and return it."""
    if error.failure is not None and state.tgi_metrics is not None:
        state.tgi_metrics.increment("tgi_request_failure", (("err", error.failure),))
    return error


def stream_headers(inputs: str) -> dict[str, str]:
    """Return the headers TGI sets on generation responses."""
    return {
        "x-compute-type": "sim",
        "x-compute-characters": str(len(inputs)),
        "x-accel-buffering": "no",
        "cache-control": "no-cache",
    }
