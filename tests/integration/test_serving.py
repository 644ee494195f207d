"""The shared app over HTTP: parity with the offline engine, the official client, placement on
the simulated node pools, and every rejection path (400 / 404 / 429 / 503)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from core.sampling import SamplingParams
from engine import LLM
from tests.cluster_fixtures import ServingApp, SimCluster
from tests.integration.support import (
    BATCHED_TOKENS,
    KV_BYTES,
    MAX_MODEL_LEN,
    MODEL,
    SERVED_NAME,
    THRESHOLD_TOKENS,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

MAX_TOKENS = 6
LONG_PROMPTS = [
    "The quick brown fox jumps over the lazy dog while the band plays on.",
    "Disaggregated serving splits prefill and decode onto separate pools of replicas.",
]
SHORT_PROMPTS = ["Hi", "One two"]
TOKEN_PROMPT_LONG = list(range(40, 90))


@pytest.fixture(scope="module")
def offline() -> Iterator[LLM]:
    """The offline engine with the app's engine options: the reference outputs."""
    yield LLM(
        MODEL,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=KV_BYTES,
        max_num_batched_tokens=BATCHED_TOKENS,
        max_num_seqs=8,
    )


def decisions(app: ServingApp) -> dict[str, float]:
    """``pdserve:disagg_decisions_total`` by decision label, from ``/metrics``."""
    text = httpx.get(app.url("/metrics"), timeout=30).text
    counts: dict[str, float] = {}
    pattern = r'^pdserve:disagg_decisions_total\{decision="(\w+)",reason="\w+"\} (\S+)$'
    for match in re.finditer(pattern, text, flags=re.MULTILINE):
        counts[match.group(1)] = counts.get(match.group(1), 0.0) + float(match.group(2))
    return counts


def complete(app: ServingApp, prompt: str | list[int], **extra: Any) -> dict[str, Any]:
    """A greedy, EOS-ignoring completion; the response body."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    response = httpx.post(app.url("/v1/completions"), json=body, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def check_ttft_breakdown(breakdown: dict[str, Any], path: str) -> None:
    """The server's stage times nest inside the TTFT the ingress measured."""
    assert breakdown["path"] == path
    assert breakdown["prefill_ms"] > 0 and breakdown["queue_ms"] >= 0
    within = breakdown["queue_ms"] + breakdown["prefill_ms"] + breakdown["export_ms"]
    assert within <= breakdown["ttft_ms"] + 0.01, breakdown
    remote = path == "remote"
    assert (breakdown["export_ms"] > 0) == remote and (breakdown["transfer_ms"] > 0) == remote
    assert (breakdown["first_decode_ms"] > 0) == remote


def stream_text(app: ServingApp, prompt: str | list[int]) -> tuple[str, int]:
    """Streamed completion text and the number of content events."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    text, events = "", 0
    with httpx.stream("POST", app.url("/v1/completions"), json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
                events += 1
    return text, events


@pytest.mark.parametrize(
    ("prompts", "path"),
    [([*LONG_PROMPTS, TOKEN_PROMPT_LONG], "remote"), (SHORT_PROMPTS, "local")],
    ids=["disaggregated", "local-prefill"],
)
def test_greedy_http_matches_offline_llm(
    app: ServingApp, offline: LLM, prompts: list[str | list[int]], path: str
) -> None:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        if isinstance(prompt, str):
            reference = offline.generate([prompt], sampling_params=params)[0]
        else:
            reference = offline.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
        before = decisions(app)
        body = complete(app, prompt)
        after = decisions(app)
        assert after.get(path, 0) == before.get(path, 0) + 1, (before, after)
        assert body["choices"][0]["text"] == reference.text
        check_ttft_breakdown(body["usage"]["ttft_breakdown"], path)
        assert body["usage"]["completion_tokens"] == len(reference.token_ids) == MAX_TOKENS
        assert body["usage"]["prompt_tokens"] == len(reference.prompt_token_ids)
        streamed, num_events = stream_text(app, prompt)
        assert streamed == reference.text
        assert num_events >= 2  # the first token arrives on its own, then decode's steps


def test_prompts_straddle_the_threshold(offline: LLM) -> None:
    short = [len(offline.tokenizer.encode(p)) for p in SHORT_PROMPTS]
    long = [len(offline.tokenizer.encode(p)) for p in LONG_PROMPTS] + [len(TOKEN_PROMPT_LONG)]
    assert max(short) < THRESHOLD_TOKENS < min(long)


def test_official_openai_client(app: ServingApp) -> None:
    client = openai.OpenAI(base_url=app.url("/v1"), api_key="unused", max_retries=0)
    assert next(m.id for m in client.models.list().data) == SERVED_NAME
    completion = client.completions.create(
        model=SERVED_NAME, prompt=LONG_PROMPTS[0], max_tokens=4, temperature=0
    )
    assert completion.choices[0].finish_reason in ("length", "stop")
    assert completion.usage is not None and completion.usage.completion_tokens >= 1
    pieces = list(
        client.completions.create(
            model=SERVED_NAME, prompt=LONG_PROMPTS[0], max_tokens=4, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces if p.choices) == completion.choices[0].text
    messages = [{"role": "user", "content": "Tell me about disaggregated serving."}]
    chat = client.chat.completions.create(
        model=SERVED_NAME, messages=messages, max_tokens=4, temperature=0
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.prompt_tokens > THRESHOLD_TOKENS
    chunks = list(
        client.chat.completions.create(
            model=SERVED_NAME,
            messages=messages,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    details = chunks[-1].usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None


def test_pools_land_on_their_own_nodes(app: ServingApp, sim_cluster: SimCluster) -> None:
    prefill_nodes = {r["node_id"] for r in app.running_replicas("Prefill")}
    decode_nodes = {r["node_id"] for r in app.running_replicas("Decode")}
    assert prefill_nodes == {sim_cluster.prefill_node_id}
    assert decode_nodes == {sim_cluster.decode_node_id}
    reported = app.board()
    assert {r["node_id"] for r in reported["prefill"]} == {sim_cluster.prefill_node_id}
    assert {r["node_id"] for r in reported["decode"]} == {sim_cluster.decode_node_id}


def _error(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == response.status_code
    return error


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "no-such-model", "prompt": "hi"}, 404, "model"),
        ({"prompt": "x" * (MAX_MODEL_LEN + 10)}, 400, "prompt"),
        ({"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
        ({"prompt": "hi", "temperature": -1}, 400, "temperature"),
        ({"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ],
    ids=["unknown-model", "prompt-too-long", "no-room", "temperature", "top_p", "max_tokens"],
)
def test_bad_requests_get_openai_errors(
    app: ServingApp, body: dict[str, Any], status: int, param: str
) -> None:
    response = httpx.post(
        app.url("/v1/completions"), json={"model": SERVED_NAME, **body}, timeout=30
    )
    assert response.status_code == status, response.text
    assert _error(response)["param"] == param


def test_malformed_json_is_a_400(app: ServingApp) -> None:
    response = httpx.post(
        app.url("/v1/completions"),
        content=b'{"model": "tiny-moe", "prompt": ',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400
    assert _error(response)["type"] == "invalid_request_error"


def test_overload_is_a_429_with_retry_after(app: ServingApp) -> None:
    limit = app.config.server.max_in_flight_requests

    async def flood() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"model": SERVED_NAME, "prompt": LONG_PROMPTS[1], "max_tokens": 24}
            calls = [client.post(app.url("/v1/completions"), json=body) for _ in range(limit * 3)]
            return list(await asyncio.gather(*calls))

    responses = asyncio.run(flood())
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected, [r.status_code for r in responses]
    assert all(r.status_code in (200, 429) for r in responses)
    assert int(rejected[0].headers["retry-after"]) == int(app.config.server.retry_after_s)
    assert _error(rejected[0])["type"] == "rate_limit_error"


def test_draining_is_a_503(app: ServingApp) -> None:
    app.set_draining(True)
    response = httpx.post(
        app.url("/v1/completions"), json={"model": SERVED_NAME, "prompt": "hi"}, timeout=30
    )
    assert response.status_code == 503
    assert _error(response)["type"] == "service_unavailable"
    assert httpx.get(app.url("/ready"), timeout=30).status_code == 503
    app.set_draining(False)
    assert httpx.get(app.url("/ready"), timeout=30).status_code == 200


def test_a_long_prompt_takes_the_pipelined_handoff_and_matches_offline(
    app: ServingApp, offline: LLM
) -> None:
    prompt = [(7 * i) % 300 + 3 for i in range(3 * BATCHED_TOKENS + 20)]  # four prefill chunks
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    reference = offline.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    body = complete(app, prompt)
    assert body["choices"][0]["text"] == reference.text
    breakdown = body["usage"]["ttft_breakdown"]
    assert breakdown["path"] == "remote" and breakdown["prefill_ms"] > 0
    assert breakdown["transfer_ms"] > 0 and breakdown["first_decode_ms"] > 0
    metrics = httpx.get(app.url("/metrics"), timeout=30).text
    assert re.search(r'^pdserve:kv_handoffs_total\{mode="pipelined"\} [1-9]', metrics, re.M)
    streamed, _ = stream_text(app, prompt)
    assert streamed == reference.text
