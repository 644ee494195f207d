"""Every bad input and failure leaves in the OpenAI error shape with the right status."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from core.errors import (
    InvalidRequestError,
    OverloadedError,
    PromptTooLongError,
    UnavailableError,
)
from tests.unit.cluster.ingress.fakes import (
    MODEL,
    FakeDecode,
    FakePrefill,
    Harness,
    run,
    sse_payloads,
)
from tests.waiting import async_wait_until

LONG = "hello world, this is a long prompt"
CHAT = [{"role": "user", "content": LONG}]
COMPLETIONS = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


def assert_error(response: Any, status: int, param: str | None, error_type: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"], error["type"]) == (status, param, error_type)
    assert error["message"]


async def send(h: Harness, path: str, **kwargs: Any) -> Any:
    async with h.client() as client:
        return await client.post(path, **kwargs)


BAD_BODIES = [
    (COMPLETIONS, {"prompt": LONG, "temperature": -1}, "temperature"),
    (COMPLETIONS, {"prompt": LONG, "temperature": "hot"}, "temperature"),
    (COMPLETIONS, {"prompt": LONG, "top_p": 0}, "top_p"),
    (COMPLETIONS, {"prompt": LONG, "top_p": 1.5}, "top_p"),
    (COMPLETIONS, {"prompt": LONG, "top_k": -5}, "top_k"),
    (COMPLETIONS, {"prompt": LONG, "max_tokens": 0}, "max_tokens"),
    (COMPLETIONS, {"prompt": LONG, "max_tokens": 2.5}, "max_tokens"),
    (COMPLETIONS, {"prompt": LONG, "min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    (COMPLETIONS, {"prompt": LONG, "n": 17}, "n"),
    (COMPLETIONS, {"prompt": LONG, "n": 0}, "n"),
    (COMPLETIONS, {"prompt": LONG, "kv_keep_alive_s": -1}, "kv_keep_alive_s"),
    (COMPLETIONS, {"prompt": LONG, "best_of": 17}, "best_of"),
    (COMPLETIONS, {"prompt": LONG, "best_of": 2, "n": 3}, "best_of"),
    (COMPLETIONS, {"prompt": LONG, "best_of": 3, "stream": True}, "best_of"),
    (COMPLETIONS, {"prompt": LONG, "seed": "abc"}, "seed"),
    (COMPLETIONS, {"prompt": LONG, "seed": 2**63}, "seed"),  # past signed 64-bit (vLLM's range)
    (CHAT_PATH, {"messages": CHAT, "seed": -(2**63) - 1}, "seed"),
    (COMPLETIONS, {"prompt": LONG, "stop": [1, 2]}, "stop"),
    (COMPLETIONS, {"prompt": LONG, "stop": ""}, "stop"),
    (COMPLETIONS, {"prompt": LONG, "stop_token_ids": ["x"]}, "stop_token_ids[0]"),
    (COMPLETIONS, {"prompt": LONG, "logprobs": 21}, "logprobs"),
    (COMPLETIONS, {"prompt": LONG, "suffix": "x"}, "suffix"),
    (COMPLETIONS, {"prompt": LONG, "presence_penalty": 2.5}, "presence_penalty"),
    (COMPLETIONS, {"prompt": LONG, "frequency_penalty": -3}, "frequency_penalty"),
    (COMPLETIONS, {"prompt": LONG, "repetition_penalty": 0}, "repetition_penalty"),
    (COMPLETIONS, {"prompt": LONG, "logit_bias": {"x": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": LONG, "logit_bias": {"5": 500}}, "logit_bias"),
    (COMPLETIONS, {"prompt": LONG, "logit_bias": {"999999": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": LONG, "stream_options": {"include_usage": "x"}},
     "stream_options.include_usage"),
    (COMPLETIONS, {}, "prompt"),
    (COMPLETIONS, {"prompt": []}, "prompt"),
    (COMPLETIONS, {"prompt": ["a", ""]}, "prompt"),
    (COMPLETIONS, {"prompt": ["a"] * 65}, "prompt"),
    (COMPLETIONS, {"prompt": [1, 99999]}, "prompt"),
    (COMPLETIONS, {"prompt": {"text": "x"}}, "prompt"),
    (CHAT_PATH, {}, "messages"),
    (CHAT_PATH, {"messages": []}, "messages"),
    (CHAT_PATH, {"messages": "hi"}, "messages"),
    (CHAT_PATH, {"messages": [{"content": "hi"}]}, "messages[0].role"),
    (CHAT_PATH, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (CHAT_PATH, {"messages": CHAT, "n": 99}, "n"),
    (CHAT_PATH, {"messages": CHAT, "top_logprobs": 3}, "top_logprobs"),
    (CHAT_PATH, {"messages": CHAT, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    (CHAT_PATH, {"messages": CHAT, "max_completion_tokens": -1}, "max_completion_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param"), BAD_BODIES)
def test_invalid_fields_are_400_naming_the_field(
    make_harness: Callable[..., Harness], path: str, body: dict[str, Any], param: str
) -> None:
    h = make_harness()
    r = run(send(h, path, json={"model": MODEL, **body}))
    assert_error(r, 400, param, "invalid_request_error")
    assert h.prefill.requests == [] and h.decode.requests == []


def test_malformed_json_and_non_objects(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    for raw in (b'{"model": "tiny", "prompt": ', b"[1, 2]", b"\xff\xfe"):
        r = run(send(h, COMPLETIONS, content=raw, headers={"content-type": "application/json"}))
        assert_error(r, 400, None, "invalid_request_error")


def test_unknown_model_is_404(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    r = run(send(h, COMPLETIONS, json={"model": "gpt-9", "prompt": LONG}))
    assert_error(r, 404, "model", "not_found_error")
    assert "gpt-9" in r.json()["error"]["message"]


def test_prompt_over_max_model_len(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(max_model_len=32)
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG}))
    assert_error(r, 400, "prompt", "invalid_request_error")
    assert "32" in r.json()["error"]["message"]
    r = run(send(h, CHAT_PATH, json={"model": MODEL, "messages": CHAT}))
    assert_error(r, 400, "messages", "invalid_request_error")
    short = {"model": MODEL, "prompt": "hi", "max_tokens": 30}  # 3 + 30 > 32
    assert_error(run(send(h, COMPLETIONS, json=short)), 400, "max_tokens", "invalid_request_error")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    r = run(send(h, CHAT_PATH, json={**chat, "max_completion_tokens": 31}))
    assert_error(r, 400, "max_completion_tokens", "invalid_request_error")


def test_body_too_large_is_413(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(max_request_body_bytes=300)
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": "x" * 400}))
    assert_error(r, 413, None, "invalid_request_error")


def test_api_keys(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(api_keys=frozenset({"sk-good", "sk-other"}))
    body = {"model": MODEL, "prompt": LONG}

    async def exchange(headers: dict[str, str]) -> list[Any]:
        async with h.client(**headers) as client:
            return [
                await client.post(COMPLETIONS, json=body),
                await client.get("/v1/models"),
                await client.get("/health"),
            ]

    for headers in ({}, {"authorization": "Bearer sk-bad"}, {"authorization": "sk-good"}):
        completion, models, health = run(exchange(headers))
        assert_error(completion, 401, None, "authentication_error")
        assert_error(models, 401, None, "authentication_error")
        assert health.status_code == 200
    completion, models, _ = run(exchange({"authorization": "Bearer sk-other"}))
    assert completion.status_code == 200 and models.status_code == 200
    assert h.prefill.requests[0].prompt_token_ids  # only the authorised request got through


def test_overload_is_429_with_retry_after(make_harness: Callable[..., Harness]) -> None:
    release = asyncio.Event()
    h = make_harness(decode=FakeDecode(release=release), max_in_flight_requests=1)
    gate = h.app.gate
    body = {"model": MODEL, "prompt": LONG, "stream": True}

    async def scenario() -> tuple[Any, Any, Any]:
        async with h.client() as client:
            first = asyncio.create_task(client.post(COMPLETIONS, json=body))
            await async_wait_until(lambda: gate.num_in_flight == 1)
            rejected = await client.post(COMPLETIONS, json=body)
            release.set()
            done = await first
            await async_wait_until(lambda: gate.num_in_flight == 0)
            again = await client.post(COMPLETIONS, json=body)
            return rejected, done, again

    rejected, done, again = run(scenario())
    assert_error(rejected, 429, None, "rate_limit_error")
    assert rejected.headers["retry-after"] == "1"
    assert done.status_code == 200 and sse_payloads(done.text)[-1] == "[DONE]"
    assert again.status_code == 200


def test_draining_is_503_and_not_ready(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()

    async def scenario() -> list[Any]:
        async with h.client() as client:
            ready_before = await client.get("/ready")
            h.app.gate.start_draining()
            return [
                ready_before,
                await client.post(COMPLETIONS, json={"model": MODEL, "prompt": LONG}),
                await client.get("/ready"),
                await client.get("/health"),
            ]

    ready_before, completion, ready, health = run(scenario())
    assert ready_before.status_code == 200 and ready_before.json()["status"] == "ready"
    assert_error(completion, 503, None, "service_unavailable")
    assert ready.status_code == 503 and ready.json()["draining"] is True
    assert health.status_code == 200


def test_ready_needs_decode_and_prefill_only_without_fallback(
    make_harness: Callable[..., Harness],
) -> None:
    cases = ((False, True, False), (True, False, True), (False, True, True))
    for prefill_ok, decode_ok, fallback in cases:
        h = make_harness(
            prefill=FakePrefill(is_healthy=prefill_ok),
            decode=FakeDecode(is_healthy=decode_ok),
            fallback_to_local_prefill=fallback,
        )

        async def probe(h: Harness = h) -> tuple[Any, Any]:
            async with h.client() as client:
                return await client.get("/ready"), await client.get("/health")

        ready, health = run(probe())
        body = ready.json()
        assert (body["prefill"], body["decode"]) == (prefill_ok, decode_ok)
        degraded = [] if prefill_ok else ["prefill_unavailable"]
        assert body["degraded"] == health.json()["degraded"] == degraded
        # With local fallback a dead prefill pool degrades serving but does not stop it.
        serves = decode_ok and (prefill_ok or fallback)
        assert ready.status_code == (200 if serves else 503), (prefill_ok, decode_ok, fallback)
        assert health.status_code == 200
        expected_reason = {
            (False, True, False): "no prefill replica is serving and local prefill is off",
            (True, False, True): "no decode replica is serving",
            (False, True, True): "decode serves alone: no prefill replica is serving",
        }[(prefill_ok, decode_ok, fallback)]
        assert expected_reason in body["reason"] and expected_reason in health.json()["reason"]


def test_ready_without_a_required_prefill_pool_needs_decode_only(
    make_harness: Callable[..., Harness],
) -> None:
    """Colocated serving, or a prefill pool autoscaled to zero: decode serves alone."""
    statuses = []
    for decode_ok in (True, False):
        h = make_harness(
            prefill=FakePrefill(is_healthy=False),
            decode=FakeDecode(is_healthy=decode_ok),
            prefill_required=False,
        )

        async def ready(h: Harness = h) -> Any:
            async with h.client() as client:
                return await client.get("/ready")

        statuses.append(run(ready()).status_code)
    assert statuses == [200, 503]


def test_unknown_route_is_openai_shaped(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()

    async def get() -> Any:
        async with h.client() as client:
            return await client.get("/v1/nothing-here")

    assert_error(run(get()), 404, None, "not_found_error")


def test_mid_stream_error_event_then_done(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(decode=FakeDecode(fail_after=1), migration_limit=0)  # the error itself
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG, "stream": True}))
    assert r.status_code == 200
    first, second, error, done = sse_payloads(r.text)
    assert [first["choices"][0]["text"], second["choices"][0]["text"]] == ["h", "el"]
    assert error["error"]["type"] == "kv_transfer_error" and error["error"]["code"] == 503
    request_id = r.headers["x-request-id"]
    assert error["error"]["message"] == (
        f"moving the prompt's KV cache between workers failed (request id {request_id})"
    )
    assert done == "[DONE]"
    assert h.decode.num_closed == 1


def test_error_chunk_without_stream_keeps_its_status(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(decode=FakeDecode(fail_after=1))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG}))
    assert_error(r, 503, "kv_handle", "kv_transfer_error")


def test_decode_error_mid_stream_reaches_the_client_with_its_param_and_status(
    make_harness: Callable[..., Harness],
) -> None:
    # The worker's typed error rides the last TokenChunk as an ErrorReport (codec + JSON).
    h = make_harness(decode=FakeDecode(fail_after=1))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG, "stream": True}))
    *_, error, done = sse_payloads(r.text)
    request_id = r.headers["x-request-id"]
    assert error["error"] == {
        "message": f"moving the prompt's KV cache between workers failed (request id {request_id})",
        "type": "kv_transfer_error",
        "param": "kv_handle",
        "code": 503,
    }
    assert done == "[DONE]"


def test_prefill_error_reaches_the_client_through_the_same_report(
    make_harness: Callable[..., Harness],
) -> None:
    # The same ErrorReport, inside a PrefillReply this time, decoded by the same table.
    error = PromptTooLongError("prompt too long for this replica", param="prompt")
    h = make_harness(prefill=FakePrefill(error=error))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG}))
    assert_error(r, 400, "prompt", "invalid_request_error")
    assert r.json()["error"]["message"] == "prompt too long for this replica"
    h = make_harness(prefill=FakePrefill(error=OverloadedError("busy", retry_after_s=3.2)))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG}))
    assert r.status_code == 200  # a retryable prefill failure falls back to local prefill


def test_dead_decode_replica_mid_stream(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(decode=FakeDecode(raise_after=1))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG, "stream": True}))
    *_, error, done = sse_payloads(r.text)
    assert error["error"]["type"] == "service_unavailable" and done == "[DONE]"
    # The cause in words and the request id; the replica's exception stays in the server log.
    assert error["error"]["message"] == (
        f"no worker could serve the request (request id {r.headers['x-request-id']})"
    )
    assert "died" not in r.text and "RuntimeError" not in r.text


def test_decode_stream_that_just_stops_is_an_error(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(decode=FakeDecode(end_early=True))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG, "stream": True}))
    *_, error, done = sse_payloads(r.text)
    assert error["error"]["code"] == 503 and done == "[DONE]"


def test_error_before_the_first_token_is_a_plain_status(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(decode=FakeDecode(fail_after=0))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": "hi", "stream": True}))
    assert_error(r, 503, "kv_handle", "kv_transfer_error")
    assert h.app.gate.num_in_flight == 0


def test_stalled_decode_times_out(make_harness: Callable[..., Harness]) -> None:
    # no migration: the stall itself must surface (migration has its own tests)
    h = make_harness(decode=FakeDecode(hang_after=1), chunk_timeout_s=0.2, migration_limit=0)
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG, "stream": True}))
    *_, error, done = sse_payloads(r.text)
    assert error["error"]["code"] == 408 and error["error"]["type"] == "timeout_error"
    assert done == "[DONE]"
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG}))
    assert_error(r, 408, None, "timeout_error")
    assert h.decode.num_closed == 2 and h.app.gate.num_in_flight == 0


def test_prefill_rejecting_the_request_does_not_fall_back(
    make_harness: Callable[..., Harness],
) -> None:
    error = InvalidRequestError("prompt blocks exceed the KV cache", param="prompt")
    h = make_harness(prefill=FakePrefill(error=error))
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG}))
    assert_error(r, 400, "prompt", "invalid_request_error")
    assert h.decode.requests == []


def test_prefill_failure_without_fallback_fails_cleanly(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(
        prefill=FakePrefill(error=RuntimeError("actor died")), fallback_to_local_prefill=False
    )
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG, "stream": True}))
    assert_error(r, 503, None, "service_unavailable")
    h.prefill.error = UnavailableError("no prefill replica")
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG}))
    assert_error(r, 503, None, "service_unavailable")
    assert h.decode.requests == []


def test_aborted_decode_is_an_error_not_a_short_answer(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(decode=FakeDecode(finish_reason="abort"), migration_limit=0)
    r = run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG, "stream": True}))
    *chunks, error, done = sse_payloads(r.text)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None]
    assert error["error"]["type"] == "service_unavailable" and done == "[DONE]"
    assert_error(run(send(h, COMPLETIONS, json={"model": MODEL, "prompt": LONG})), 503, None,
                 "service_unavailable")  # fmt: skip
