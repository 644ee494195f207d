"""The official ``openai`` client against the in-process app: completions and chat, both modes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest

from tests.unit.cluster.ingress.fakes import MODEL, Harness, run

LONG = "hello world, this is a long prompt"
KEY = "sk-test"


def client_for(h: Harness, api_key: str = KEY) -> openai.AsyncOpenAI:
    # NOTE: this openai release is built on httpx2 (httpx's successor), so its transport.
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=h.app.asgi))
    return openai.AsyncOpenAI(
        base_url="http://ingress/v1", api_key=api_key, http_client=http, max_retries=0
    )


def test_completions_and_chat(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(api_keys=frozenset({KEY}))

    async def scenario() -> dict[str, Any]:
        async with client_for(h) as client:
            models = await client.models.list()
            completion = await client.completions.create(model=MODEL, prompt=LONG, max_tokens=3)
            stream = await client.completions.create(
                model=MODEL, prompt=LONG, max_tokens=3, stream=True
            )
            streamed = [chunk async for chunk in stream]
            chat = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": LONG}], max_tokens=3
            )
            chat_stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_completion_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
            )
            chat_chunks = [chunk async for chunk in chat_stream]
            return {
                "models": models,
                "completion": completion,
                "streamed": streamed,
                "chat": chat,
                "chat_chunks": chat_chunks,
            }

    out = run(scenario())
    assert [m.id for m in out["models"].data] == [MODEL]
    completion = out["completion"]
    assert completion.choices[0].text == "hello"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 3
    assert completion.usage.prompt_tokens_details.cached_tokens == 16
    assert "".join(c.choices[0].text for c in out["streamed"]) == "hello"
    chat = out["chat"]
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == "hello"
    *token_chunks, usage_chunk = out["chat_chunks"]
    assert "".join(c.choices[0].delta.content or "" for c in token_chunks) == "hello"
    assert token_chunks[0].choices[0].delta.role == "assistant"
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 3


def test_client_errors_map_to_openai_exceptions(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(api_keys=frozenset({KEY}))

    async def unknown_model() -> None:
        async with client_for(h) as client:
            await client.completions.create(model="gpt-9", prompt=LONG)

    async def bad_temperature() -> None:
        async with client_for(h) as client:
            await client.completions.create(model=MODEL, prompt=LONG, temperature=-1)

    async def bad_key() -> None:
        async with client_for(h, api_key="sk-wrong") as client:
            await client.completions.create(model=MODEL, prompt=LONG)

    with pytest.raises(openai.NotFoundError):
        run(unknown_model())
    with pytest.raises(openai.BadRequestError) as bad:
        run(bad_temperature())
    assert bad.value.param == "temperature"
    with pytest.raises(openai.AuthenticationError):
        run(bad_key())
