"""OpenAI compatibility gaps found with real clients: retrieving one model, a 404 that names
the models served, a path without /v1, and 401 text in HTTP terms."""

from __future__ import annotations

import openai
import pytest

from .conftest import Door
from .test_door import CHAT, post


async def test_models_retrieve_and_unknown_models(keyed_door: Door) -> None:
    client = openai.AsyncOpenAI(base_url=f"{keyed_door.url}/v1", api_key="alice-key", max_retries=0)
    model = await client.models.retrieve("sim")
    assert (model.id, model.object, model.owned_by) == ("sim", "model", "fairq")
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("gpt-9")
    assert caught.value.code == "model_not_found"
    assert "models served: sim" in caught.value.message
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "hi"}]
        )
    assert "'gpt-9' does not exist here; models served: sim" in caught.value.message
    # A wrong key learns nothing about the models.
    stranger = openai.AsyncOpenAI(base_url=f"{keyed_door.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        await stranger.models.retrieve("sim")
    assert "metadata" not in auth.value.message


async def test_http_words_in_401_and_a_missing_v1(keyed_door: Door) -> None:
    status, _, doc = await post(f"{keyed_door.url}/v1/chat/completions", CHAT)
    assert status == 401
    assert "missing 'authorization: Bearer <api key>' header" in doc["error"]["message"]
    status, _, doc = await post(f"{keyed_door.url}/chat/completions", CHAT)
    assert status == 404
    assert "under /v1" in doc["error"]["message"]
