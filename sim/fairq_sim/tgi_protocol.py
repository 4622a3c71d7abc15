"""TGI 3.3's wire format: parameter validation, stream events, responses, errors.

Shapes follow TGI's router (``router/src/lib.rs``, ``server.rs``, ``validation.rs``) as
summarised in ``shared/reference/BACKENDS.md``: stream ``index`` counts from 1, the last event
carries ``generated_text`` (and ``details`` when asked for), there is no ``[DONE]`` on
``/generate_stream``, finish reasons are ``length|eos_token|stop_sequence``, and errors are
``{"error", "error_type"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from fairq_sim.http_common import sse_data
from fairq_sim.request import FinishReason, SimRequest

__all__ = [
    "MAX_STOP_SEQUENCES",
    "SYSTEM_FINGERPRINT",
    "VERSION",
    "GenerateParams",
    "TgiError",
    "chat_finish_reason",
    "finish_reason",
    "info",
    "overloaded",
    "parse_parameters",
    "token_json",
    "validation_error",
]

VERSION = "3.3.6-dev0"
SYSTEM_FINGERPRINT = f"{VERSION}-native"
MAX_STOP_SEQUENCES = 4


class TgiError(Exception):
    """An error in TGI's ``{"error", "error_type"}`` shape.

    Args:
        status: HTTP status when answered before streaming.
        error_type: TGI's ``error_type`` (``validation``, ``overloaded``, ...).
        message: Human-readable message.
        failure: ``err`` label of ``tgi_request_failure`` to count, if any.

    """

    def __init__(self, status: int, error_type: str, message: str, failure: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.failure = failure

    def body(self) -> dict[str, str]:
        """Return the JSON body."""
        return {"error": self.message, "error_type": self.error_type}

    def response(self) -> JSONResponse:
        """Return the HTTP error response (non-streaming endpoints)."""
        return JSONResponse(self.body(), status_code=self.status)

    def event(self) -> bytes:
        """Return the error as a ``/generate_stream`` event (sent with HTTP 200)."""
        return sse_data(self.body())

    def chat_event(self) -> bytes:
        """Return the error as a Messages API stream event."""
        return sse_data({"error": {"message": self.message, "http_status_code": 422}})


def validation_error(message: str) -> TgiError:
    """Return a 422 input validation error."""
    return TgiError(422, "validation", f"Input validation error: {message}", "validation")


def overloaded() -> TgiError:
    """Return the 429 "Model is overloaded" error."""
    return TgiError(429, "overloaded", "Model is overloaded", "overloaded")


@dataclass
class GenerateParams:
    """What the simulator takes from TGI generation parameters."""

    input_length: int
    max_new_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    do_sample: bool
    details: bool
    return_full_text: bool


def parse_parameters(
    parameters: dict[str, Any] | None,
    input_length: int,
    max_input_tokens: int,
    max_total_tokens: int,
    *,
    default_full_text: bool,
) -> GenerateParams:
    """Validate parameters in TGI's order, for the checks the simulator can make.

    Args:
        parameters: The request's ``parameters`` (None when omitted).
        input_length: Prompt tokens.
        max_input_tokens: Longest accepted prompt.
        max_total_tokens: Prompt plus new tokens limit.
        default_full_text: ``return_full_text`` when unset (true on ``/``).

    Raises:
        TgiError: A 422 validation error.

    """
    p: dict[str, Any] = parameters if parameters is not None else {"do_sample": True}
    temperature = p.get("temperature")
    if temperature is not None and temperature <= 0:
        raise validation_error("`temperature` must be strictly positive")
    penalty = p.get("repetition_penalty")
    if penalty is not None and penalty <= 0:
        raise validation_error("`repetition_penalty` must be strictly positive")
    top_p = p.get("top_p")
    if top_p is not None and not 0.0 < top_p < 1.0:
        raise validation_error("`top_p` must be > 0.0 and < 1.0")
    top_k = p.get("top_k")
    if top_k is not None and top_k <= 0:
        raise validation_error("`top_k` must be strictly positive")
    max_new = p.get("max_new_tokens")
    if max_new is not None and max_new <= 0:
        raise validation_error("`max_new_tokens` must be strictly positive")
    stop = tuple(str(s) for s in p.get("stop") or ())
    if len(stop) > MAX_STOP_SEQUENCES:
        raise validation_error(
            f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(stop)}"
        )
    if input_length > max_input_tokens:
        raise validation_error(
            f"`inputs` must have less than {max_input_tokens} tokens. Given: {input_length}"
        )
    if max_new is None:
        max_new = max_total_tokens - input_length
    if input_length + max_new > max_total_tokens:
        raise validation_error(
            f"`inputs` tokens + `max_new_tokens` must be <= {max_total_tokens}. Given: "
            f"{input_length} `inputs` tokens and {max_new} `max_new_tokens`"
        )
    full_text = p.get("return_full_text")
    seed = p.get("seed")
    return GenerateParams(
        input_length=input_length,
        max_new_tokens=int(max_new),
        stop=tuple(s for s in stop if s),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        do_sample=bool(p.get("do_sample") or False),
        details=bool(p.get("details") or False),
        return_full_text=default_full_text if full_text is None else bool(full_text),
    )


def finish_reason(request: SimRequest) -> str:
    """Return TGI's finish reason: ``length``, ``eos_token`` or ``stop_sequence``."""
    if request.finish_reason is FinishReason.STOP:
        return "eos_token" if request.stop_reason is None else "stop_sequence"
    return "length"


def chat_finish_reason(request: SimRequest) -> str:
    """Return the Messages API finish reason (EOS becomes ``stop``)."""
    reason = finish_reason(request)
    return "stop" if reason == "eos_token" else reason


def token_json(token_id: int, text: str, logprob: float, special: bool) -> dict[str, Any]:
    """Return a ``Token`` object."""
    return {"id": token_id, "text": text, "logprob": logprob, "special": special}


def info(model: str, max_concurrent: int, max_input: int, max_total: int) -> dict[str, Any]:
    """Return the ``/info`` body (TGI 3.3 fields)."""
    return {
        "model_id": model,
        "model_sha": None,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": max_concurrent,
        "max_best_of": 2,
        "max_stop_sequences": MAX_STOP_SEQUENCES,
        "max_input_tokens": max_input,
        "max_total_tokens": max_total,
        "validation_workers": 2,
        "max_client_batch_size": 4,
        "router": "text-generation-router",
        "version": VERSION,
        "sha": None,
        "docker_label": None,
    }
