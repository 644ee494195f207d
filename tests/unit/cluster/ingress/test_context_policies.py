"""Context policies: per-request ``truncate_prompt_tokens`` and the server's
``context_overflow`` (error with the numbers, or truncate from the left)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import MODEL, Harness, run

# max_model_len is 256 in the harness; the byte tokenizer gives one token per byte (+ BOS)
LONG_TEXT = "x" * 300


def post(h: Harness, body: dict[str, Any], path: str = "/v1/completions") -> httpx.Response:
    async def go() -> httpx.Response:
        async with h.client() as client:
            return await client.post(path, json={"model": MODEL, **body})

    return run(go())


def test_truncate_prompt_tokens_keeps_the_last_n(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    h = make_harness()
    text = "hello world, this is a long prompt"
    r = post(h, {"prompt": text, "max_tokens": 2, "truncate_prompt_tokens": 10})
    assert r.status_code == 200, r.text
    assert h.prefill.requests[0].prompt_token_ids == tokenizer.encode(text)[-10:]
    assert r.json()["usage"]["prompt_tokens"] == 10
    over = post(h, {"prompt": LONG_TEXT, "max_tokens": 1, "truncate_prompt_tokens": -1})
    assert over.status_code == 200, over.text
    assert len(h.prefill.requests[1].prompt_token_ids) == 255  # max_model_len - 1
    bad = post(h, {"prompt": text, "truncate_prompt_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncate_prompt_tokens"


def test_overflow_is_an_error_with_the_numbers_by_default(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    r = post(h, {"prompt": LONG_TEXT, "max_tokens": 4})
    assert r.status_code == 400
    error = r.json()["error"]
    assert "maximum context length is 256 tokens" in error["message"]
    assert "301 tokens" in error["message"] and error["param"] == "prompt"


def test_truncate_left_drops_the_oldest_tokens_to_fit(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    h = make_harness(context_overflow="truncate_left")
    r = post(h, {"prompt": LONG_TEXT, "max_tokens": 6})
    assert r.status_code == 200, r.text
    ids = tokenizer.encode(LONG_TEXT)
    assert h.prefill.requests[0].prompt_token_ids == ids[-250:]  # 256 - 6 for the output
    chat = post(
        h,
        {"messages": [{"role": "user", "content": LONG_TEXT}]},
        "/v1/chat/completions",
    )
    assert chat.status_code == 200, chat.text
    assert len(h.prefill.requests[1].prompt_token_ids) == 240  # room for 16 by default
    too_many = post(h, {"prompt": "hi", "max_tokens": 300})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"
