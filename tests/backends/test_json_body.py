"""A backend request's body: orjson's bytes where they mean what the standard library's do."""

from __future__ import annotations

import json
import math

from fairq_server.backends.openai_wire import json_body


def test_a_plain_body_reads_back_the_same() -> None:
    payload = {
        "model": "sim",
        "prompt": 'héllo \u2028 "quoted" \\ ✓',
        "max_tokens": 16,
        "temperature": 0.7,
        "stop": ["\n\n"],
        "stream_options": {"include_usage": True},
        "logit_bias": {"50256": -100},
    }
    assert json.loads(json_body(payload)) == payload


def test_nan_and_infinity_are_written_as_the_standard_library_does() -> None:
    # orjson would write null (a different request); the backend refuses NaN as before.
    body = json_body({"model": "sim", "presence_penalty": math.nan, "x": math.inf})
    assert (
        body == json.dumps({"model": "sim", "presence_penalty": math.nan, "x": math.inf}).encode()
    )
    assert b"NaN" in body and b"Infinity" in body


def test_an_integer_beyond_64_bits_is_kept() -> None:
    body = json_body({"model": "sim", "seed": 10**30})
    assert json.loads(body)["seed"] == 10**30


def test_a_null_is_kept() -> None:
    assert json.loads(json_body({"model": "sim", "stop": None})) == {"model": "sim", "stop": None}
