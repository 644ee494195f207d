"""``/tokenize``, ``/detokenize`` and ``/version`` in vLLM's shapes; tokenize counts what the
generation routes count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import MODEL, Harness, run

TEXT = "Hello, wörld! A prompt to count."


async def post(h: Harness, path: str, body: dict[str, Any], **headers: str) -> Any:
    async with h.client(**headers) as client:
        return await client.post(path, json=body)


def test_tokenize_a_prompt_counts_what_a_completion_would(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    h = make_harness()
    response = run(post(h, "/tokenize", {"model": MODEL, "prompt": TEXT}))
    assert response.status_code == 200, response.text
    body = response.json()
    expected = tokenizer.encode(TEXT)  # BOS + one token per byte for the built-in tokenizer
    assert body == {
        "count": len(expected),
        "max_model_len": 256,
        "tokens": expected,
        "token_strs": None,
    }
    assert body["count"] == len(TEXT.encode()) + 1
    bare = run(post(h, "/tokenize", {"prompt": TEXT, "add_special_tokens": False})).json()
    assert bare["tokens"] == tokenizer.encode(TEXT, add_special_tokens=False)
    assert bare["count"] == body["count"] - 1


def test_tokenize_chat_messages_applies_the_template(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    h = make_harness()
    messages = [{"role": "user", "content": TEXT}]
    body = run(post(h, "/tokenize", {"model": MODEL, "messages": messages})).json()
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert body["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    assert body["count"] > len(TEXT.encode())
    strs = run(post(h, "/tokenize", {"prompt": "ab", "return_token_strs": True})).json()
    assert strs["token_strs"][1:] == ["a", "b"]


def test_detokenize_round_trips(make_harness: Callable[..., Harness], tokenizer: Tokenizer) -> None:
    h = make_harness()
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    response = run(post(h, "/detokenize", {"model": MODEL, "tokens": ids}))
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": TEXT}


def test_tokenize_errors_are_openai_shaped(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(max_request_body_bytes=64)
    cases = [
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"model": MODEL}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": []}, 400, "prompt"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, None),
        ("/detokenize", {"tokens": [1, 10**6]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ("/tokenize", {"prompt": "x" * 100}, 413, None),
    ]
    for path, body, status, param in cases:
        response = run(post(h, path, body))
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == status and error["message"]
        if param is not None:
            assert error["param"] == param, (body, error)


def test_tokenize_needs_the_api_key(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(api_keys=frozenset({"sk-good"}))
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        assert run(post(h, path, body)).status_code == 401
        ok = run(post(h, path, body, authorization="Bearer sk-good"))
        assert ok.status_code == 200, ok.text


def test_version_answers_the_installed_package(make_harness: Callable[..., Harness]) -> None:
    import importlib.metadata

    h = make_harness()

    async def get() -> Any:
        async with h.client() as client:
            return await client.get("/version")

    response = run(get())
    assert response.status_code == 200
    assert response.json() == {"version": importlib.metadata.version("pdserve")}
