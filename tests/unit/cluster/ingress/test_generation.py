"""The OpenAI protocol over fake pools: bodies, SSE framing, usage, routing of the handoff."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.hashing import hash_prompt_blocks
from core.messages import StageTimes
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import (
    HANDLE,
    MODEL,
    FakeDecode,
    FakePrefill,
    Harness,
    run,
    sse_payloads,
)

LONG = "hello world, this is a long prompt"  # 35 tokens: over the threshold of 8 -> remote
SHORT = "hi"  # 3 tokens -> local prefill on decode


async def post(h: Harness, path: str, body: dict[str, Any], **headers: str) -> Any:
    async with h.client(**headers) as client:
        return await client.post(path, json={"model": MODEL, **body})


def test_completion_remote_prefill_then_decode(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    prefill = FakePrefill(delay_s=0.03, stage_times=StageTimes(0.004, 0.010, export_s=0.001))
    decode = FakeDecode(stage_times=StageTimes(transfer_s=0.02, first_decode_s=0.003))
    h = make_harness(prefill=prefill, decode=decode)
    r = run(post(h, "/v1/completions", {"prompt": LONG, "max_tokens": 3, "temperature": 0}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"index": 0, "text": "hello", "logprobs": None, "finish_reason": "length"}
    ]
    prompt_ids = tokenizer.encode(LONG)
    breakdown = body["usage"].pop("ttft_breakdown")
    assert breakdown["ttft_ms"] >= 30.0  # the prefill's delay
    assert breakdown["dispatch_ms"] == pytest.approx(breakdown["ttft_ms"] - 15.0, abs=0.01)
    assert {k: v for k, v in breakdown.items() if k not in ("ttft_ms", "dispatch_ms")} == {
        "path": "remote", "queue_ms": 4.0, "prefill_ms": 10.0, "export_ms": 1.0,
        "transfer_ms": 20.0, "first_decode_ms": 3.0,
    }  # fmt: skip
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 3,
        "total_tokens": len(prompt_ids) + 3,
        "prompt_tokens_details": {"cached_tokens": 16},  # what the prefill reused
    }
    (prefill_req,) = h.prefill.requests
    (decode_req,) = h.decode.requests
    assert prefill_req.prompt_token_ids == prompt_ids == decode_req.prompt_token_ids
    assert prefill_req.request_id == decode_req.request_id == body["id"]
    assert prefill_req.sampling.max_tokens == 3
    assert decode_req.first_token_id == 104 and decode_req.kv_handle == HANDLE


def test_short_prompt_prefills_locally_on_decode(make_harness: Callable[..., Harness]) -> None:
    times = StageTimes(queue_s=0.002, prefill_s=0.005)
    h = make_harness(decode=FakeDecode(num_cached_tokens=2, stage_times=times))
    r = run(post(h, "/v1/completions", {"prompt": SHORT, "max_tokens": 3}))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "hello"
    breakdown = r.json()["usage"]["ttft_breakdown"]
    assert breakdown["path"] == "local" and breakdown["transfer_ms"] == 0.0
    assert (breakdown["queue_ms"], breakdown["prefill_ms"]) == (2.0, 5.0)
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert h.prefill.requests == []
    (decode_req,) = h.decode.requests
    assert decode_req.first_token_id is None and decode_req.kv_handle is None


def test_streamed_completion_framing_and_usage(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    body = {"prompt": LONG, "max_tokens": 3, "stream": True}
    r = run(post(h, "/v1/completions", {**body, "stream_options": {"include_usage": True}}))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    *chunks, usage, done = sse_payloads(r.text)
    assert done == "[DONE]"
    assert [c["choices"][0]["text"] for c in chunks] == ["h", "el", "lo"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert all(c["usage"] is None and c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in [*chunks, usage]}) == 1
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 3
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == 16


def test_stream_without_include_usage_has_no_usage(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    r = run(post(h, "/v1/completions", {"prompt": LONG, "max_tokens": 3, "stream": True}))
    *chunks, done = sse_payloads(r.text)
    assert done == "[DONE]" and len(chunks) == 3
    assert all("usage" not in c for c in chunks)


def test_chat_applies_template_and_answers(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    h = make_harness()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": LONG}]
    r = run(post(h, "/v1/chat/completions", {"messages": messages, "max_completion_tokens": 3}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    expected = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    assert h.prefill.requests[0].prompt_token_ids == expected
    assert body["usage"]["prompt_tokens"] == len(expected)


def test_chat_stream_sends_role_with_first_token(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    body = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 3, "stream": True}
    r = run(post(h, "/v1/chat/completions", body))
    *chunks, done = sse_payloads(r.text)
    assert done == "[DONE]"
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [{"role": "assistant", "content": "h"}, {"content": "el"}, {"content": "lo"}]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_prefill_that_finishes_the_request_skips_decode(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(prefill=FakePrefill(finish_reason="length"))
    r = run(post(h, "/v1/completions", {"prompt": LONG, "max_tokens": 1}))
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("h", "length")
    assert r.json()["usage"]["completion_tokens"] == 1
    assert h.decode.requests == []


def test_sampling_fields_reach_the_workers(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    body = {
        "prompt": LONG,
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "seed": 11,
        "stop": ["\n\n", "END"],
        "stop_token_ids": [3],
        "ignore_eos": True,
        "min_tokens": 2,
        "kv_keep_alive_s": 120,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    assert run(post(h, "/v1/completions", body)).status_code == 200
    params = h.prefill.requests[0].sampling
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (5, 0.5, 0.9, 7)
    assert (params.seed, params.stop, params.stop_token_ids) == (11, ("\n\n", "END"), (3,))
    assert params.ignore_eos and params.min_tokens == 2 and params.kv_keep_alive_s == 120
    assert not params.skip_special_tokens and params.include_stop_str_in_output
    assert h.decode.requests[0].sampling == h.prefill.requests[0].sampling


def test_any_signed_64_bit_seed_reaches_the_workers(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    seeds = [-1, -(2**63), 2**63 - 1]
    for seed in seeds:
        r = run(post(h, "/v1/completions", {"prompt": LONG, "max_tokens": 2, "seed": seed}))
        assert r.status_code == 200, r.text
    assert [request.sampling.seed for request in h.prefill.requests] == seeds
    r = run(post(h, "/v1/completions", {"prompt": LONG, "n": 2, "seed": 2**63 - 1}))
    assert r.status_code == 200, r.text
    assert {request.sampling.seed for request in h.prefill.requests[3:]} == {2**63 - 1, -(2**63)}


def test_default_max_tokens(make_harness: Callable[..., Harness], tokenizer: Tokenizer) -> None:
    h = make_harness()
    run(post(h, "/v1/completions", {"prompt": LONG}))
    assert h.prefill.requests[0].sampling.max_tokens == 16
    messages = [{"role": "user", "content": LONG}]
    run(post(h, "/v1/chat/completions", {"messages": messages}))
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    assert h.prefill.requests[1].sampling.max_tokens == 256 - len(prompt)


def test_token_id_prompts(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    ids = list(range(40, 60))
    assert run(post(h, "/v1/completions", {"prompt": ids})).status_code == 200
    assert run(post(h, "/v1/completions", {"prompt": [ids]})).status_code == 200
    assert [r.prompt_token_ids for r in h.prefill.requests] == [ids, ids]


def test_client_transfer_params_are_ignored(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    evil = {
        "do_remote_prefill": True,
        "remote_host": "10.0.0.66",
        "transfer_id": "xfer-stolen",
        "kv_handle": {"transfer_id": "xfer-stolen", "address": "10.0.0.66:1"},
    }
    for prompt in (LONG, SHORT):
        body = {"prompt": prompt, "kv_transfer_params": evil, "kv_handle": evil["kv_handle"]}
        assert run(post(h, "/v1/completions", body)).status_code == 200
    remote, local = h.decode.requests
    assert remote.kv_handle == HANDLE and local.kv_handle is None
    for request in (*h.prefill.requests, *h.decode.requests):
        assert "xfer-stolen" not in repr(request) and "10.0.0.66" not in repr(request)
        assert request.sampling.extra == {}


def test_request_ids_are_echoed(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    r = run(post(h, "/v1/completions", {"prompt": LONG}, **{"x-request-id": "client-42"}))
    assert r.headers["x-request-id"] == "client-42"
    assert h.prefill.requests[0].request_id != "client-42"  # internal ids stay unique
    r2 = run(post(h, "/v1/completions", {"prompt": LONG}))
    assert r2.headers["x-request-id"] == r2.json()["id"]
    r3 = run(post(h, "/v1/completions", {"model": "nope", "prompt": LONG}))
    assert r3.status_code == 404 and r3.headers["x-request-id"].startswith("cmpl-")


def test_block_hashes_feed_the_decision(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    seen: list[list[int]] = []

    def cached_blocks(hashes: Any) -> int:
        seen.append(list(hashes))
        return len(hashes)  # the decode pool caches the whole prompt

    h = make_harness(cached_blocks_fn=cached_blocks)
    assert run(post(h, "/v1/completions", {"prompt": LONG})).status_code == 200
    assert seen == [hash_prompt_blocks(tokenizer.encode(LONG), 4, seed=0)]
    assert h.prefill.requests == []  # 35 tokens, 32 cached: 3 uncached < 8 -> local
    metrics = h.app.metrics.registry
    labels = {"decision": "local", "reason": "cached_prefix"}
    assert metrics.get_sample_value("pdserve:disagg_decisions_total", labels) == 1.0


def test_vllm_bench_payloads_are_accepted(make_harness: Callable[..., Harness]) -> None:
    """The bodies ``vllm bench serve`` sends (content parts, logprobs null, penalty 1.0)."""
    h = make_harness()
    common = {"temperature": 0.0, "repetition_penalty": 1.0, "stream": True, "ignore_eos": True,
              "stream_options": {"include_usage": True}}  # fmt: skip
    completion = {"prompt": LONG, "max_tokens": 3, "logprobs": None, **common}
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
    chat = {"messages": [{"role": "user", "content": parts}], "max_completion_tokens": 3}
    for path, body in (
        ("/v1/completions", completion),
        ("/v1/chat/completions", {**chat, **common}),
    ):
        r = run(post(h, path, body))
        assert r.status_code == 200, r.text
        assert sse_payloads(r.text)[-2]["usage"]["completion_tokens"] == 3
