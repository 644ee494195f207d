"""Bodies and headers that used to reach a 500, routes that used to be open, and what an error
may say: each answered with a 4xx in the OpenAI shape, and the server keeps serving after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cluster.ingress.http.public_errors import for_client, scrub
from core.errors import InvalidRequestError, TransferError, UnavailableError
from tests.unit.cluster.ingress.fakes import MODEL, Harness, run

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


async def post_raw(h: Harness, path: str, body: str, **headers: str) -> Any:
    async with h.client(**headers) as client:
        return await client.post(path, content=body.encode(), headers=JSON)


async def get(h: Harness, path: str, **headers: str) -> Any:
    async with h.client(**headers) as client:
        return await client.get(path)


def assert_400(response: Any, param: str | None, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, 400)
    assert words in error["message"]


def still_serves(h: Harness) -> None:
    good = run(post_raw(h, COMPLETIONS, f'{{"model": "{MODEL}", "prompt": "hello"}}'))
    assert good.status_code == 200, good.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (COMPLETIONS, '{"prompt": "a\\ud800b"}', "prompt"),
        (COMPLETIONS, '{"prompt": ["\\udfff"]}', "prompt[0]"),
        (CHAT, '{"messages": [{"role": "user", "content": "x\\ud83d"}]}', "messages[0].content"),
        (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "user": "\\ud800"}', "user"),
    ],
)
def test_lone_surrogates_are_a_400_naming_the_field(
    make_harness: Callable[..., Harness], path: str, body: str, param: str
) -> None:
    h = make_harness()
    assert_400(run(post_raw(h, path, body)), param, "unpaired UTF-16 surrogate")
    still_serves(h)


@pytest.mark.parametrize("depth", [33, 200, 100_000])
def test_deep_nesting_is_a_400(make_harness: Callable[..., Harness], depth: int) -> None:
    h = make_harness()
    body = '{"prompt": "hi", "metadata": ' + "[" * depth + "]" * depth + "}"
    response = run(post_raw(h, COMPLETIONS, body))
    assert response.status_code == 400, response.text
    assert "nests deeper than 32 levels" in response.json()["error"]["message"]
    still_serves(h)


def test_nesting_within_the_limit_is_not_refused_for_depth(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    nested = "[" * 30 + "]" * 30
    body = f'{{"model": "{MODEL}", "prompt": "hi", "metadata": {nested}}}'
    response = run(post_raw(h, COMPLETIONS, body))
    assert "nests deeper" not in response.text


def test_empty_text_prompt_is_a_400(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    assert_400(run(post_raw(h, COMPLETIONS, '{"prompt": ""}')), "prompt", "prompt is empty")
    assert_400(run(post_raw(h, COMPLETIONS, '{"prompt": [""]}')), "prompt", "prompt is empty")
    still_serves(h)


def test_oversized_headers_are_a_400(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(max_header_bytes=4096)
    response = run(get(h, "/health", **{"x-padding": "p" * 5000}))
    assert_400(response, None, "more than the 4096 this server accepts")
    assert run(get(h, "/health", **{"x-padding": "p" * 1000})).status_code == 200


@pytest.mark.parametrize("path", ["/metrics", "/openapi.json", "/v1/models", "/nowhere"])
def test_with_api_keys_every_route_needs_a_key(
    make_harness: Callable[..., Harness], path: str
) -> None:
    h = make_harness(api_keys=frozenset({"k1"}))
    refused = run(get(h, path))
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    assert run(get(h, path, authorization="Bearer wrong")).status_code == 401
    assert run(get(h, path, authorization="Bearer k1")).status_code != 401


def test_probes_need_no_key_and_public_routes_open_explicitly(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(api_keys=frozenset({"k1"}), public_routes=("/metrics",))
    assert run(get(h, "/health")).status_code == 200
    assert run(get(h, "/ready")).status_code in (200, 503)
    assert run(get(h, "/metrics")).status_code == 200
    assert run(get(h, "/openapi.json")).status_code == 401
    rejected = [
        line
        for line in run(get(h, "/metrics")).text.splitlines()
        if line.startswith("pdserve:requests_rejected_total") and 'reason="unauthorized"' in line
    ]
    assert len(rejected) == 1 and rejected[0].endswith(" 1.0")


def test_scrub_removes_internals_and_keeps_words() -> None:
    raw = (
        "\x1b[36mray::Prefill.prefill()\x1b[39m (pid=4242, ip=10.1.2.3) actor "
        "5f3c0b0c9a1d4e6f8a7b6c5d4e3f2a1b failed at /opt/app/engine/runner.py for "
        "xfer-0123456789abcdef0123456789abcdef on 10.0.0.7:50051\n"
        "Traceback (most recent call last):\n  File x\nValueError: boom"
    )
    clean = scrub(raw)
    for secret in ("4242", "10.1.2.3", "5f3c0b0c", "/opt/app", "xfer-0123", "50051", "\x1b"):
        assert secret not in clean
    assert "Traceback" not in clean and "boom" not in clean
    assert clean.startswith("ray::Prefill.prefill() (pid=<pid>, ip=<address>) actor <id> failed")


def test_server_errors_say_what_and_the_request_id() -> None:
    error = TransferError("pull xfer-00ff of 12 blocks from 10.0.0.9:7000 failed", reason="x")
    public = for_client(error, "cmpl-1")
    assert isinstance(public, TransferError) and public.status_code == 503
    assert public.message == (
        "moving the prompt's KV cache between workers failed (request id cmpl-1)"
    )
    assert error.message.startswith("pull xfer-00ff")  # the original is not changed
    unavailable = for_client(UnavailableError("ray actor died"), "cmpl-2")
    assert unavailable.message == "no worker could serve the request (request id cmpl-2)"


def test_client_errors_keep_their_words() -> None:
    error = InvalidRequestError("temperature must be >= 0", param="temperature")
    assert for_client(error, "cmpl-3") is error
