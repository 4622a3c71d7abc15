"""Parsing one backend stream event (every token of both doors passes here)."""

from __future__ import annotations

import pytest

from fairq_server.backends.vllm import VllmBackend
from fairq_server.errors import BackendError, BackendFailure


def _backend() -> VllmBackend:
    return VllmBackend("b", "http://127.0.0.1:9", ["m"])


def test_an_event_is_parsed_into_its_object() -> None:
    obj = _backend().decode_event('{"choices":[{"index":0,"text":"a","finish_reason":null}]}')
    assert obj == {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}


@pytest.mark.parametrize("payload", ['{"x": NaN}', '{"x": Infinity}', '{"x": 1', "[1, 2]"])
def test_what_json_does_not_allow_is_a_malformed_event(payload: str) -> None:
    with pytest.raises(BackendError) as caught:
        _backend().decode_event(payload)
    assert caught.value.kind is BackendFailure.FAILED
    assert "backend b:" in str(caught.value)
