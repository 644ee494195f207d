"""The ingress over real prefill and decode workers (tiny-llama, in-process KV transport).

Greedy output over HTTP, through both the disaggregated and the local-prefill path, must be
token-identical to the offline ``LLM`` (the peer), and both workers must end quiescent.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi import FastAPI

from cluster.ingress import IngressSettings, create_app
from cluster.ingress.model_table import ModelEndpoint
from core.config import DisaggregationConfig, EngineConfig, ModelConfig
from core.messages import DecodeRequest, PrefillRequest, PrefillResult, TokenChunk
from core.sampling import SamplingParams
from decode.worker import DecodeWorker
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.llm import LLM
from engine.setup import build_engine_parts
from engine.tokenizer import Tokenizer
from prefill.worker import PrefillWorker
from tests.unit.cluster.ingress.fakes import run, sse_payloads
from tests.waiting import async_wait_until
from transfer import InProcKVHub, InProcKVTransport

MODEL = ModelConfig(name="builtin:tiny-llama")
ENGINE = EngineConfig(max_model_len=512, kv_cache_memory_bytes=16 << 20)
MAX_TOKENS = 10
THRESHOLD_TOKENS = 32
_rng = random.Random(7)
PROMPTS = {
    "remote": [_rng.randrange(3, 250) for _ in range(70)],  # over the threshold
    "local": [_rng.randrange(3, 250) for _ in range(12)],  # under it
}


@dataclass
class SpyPrefill:
    """The real prefill worker behind the ingress's Protocol, recording its first tokens."""

    worker: PrefillWorker
    first_token_ids: dict[str, int] = field(default_factory=dict)

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        result = await self.worker.prefill(request)
        self.first_token_ids[request.request_id] = result.first_token_id
        return result

    def healthy(self) -> bool:
        return True


@dataclass
class SpyDecode:
    """The real decode worker behind the ingress's Protocol, recording the streamed ids."""

    worker: DecodeWorker
    token_ids: dict[str, list[int]] = field(default_factory=dict)

    def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        return self._record(request)

    async def _record(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        ids = self.token_ids.setdefault(request.request_id, [])
        stream = self.worker.generate(request)
        try:
            async for chunk in stream:
                ids.extend(chunk.token_ids)
                yield chunk
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def healthy(self) -> bool:
        return True


@dataclass
class Workers:
    prefill: PrefillWorker
    decode: DecodeWorker
    tokenizer: Tokenizer


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    hub = InProcKVHub()
    engines = [AsyncEngine(LLMEngine(build_engine_parts(MODEL, ENGINE))) for _ in range(2)]
    transports = [InProcKVTransport(e.engine.parts.storage, hub) for e in engines]
    prefill = PrefillWorker(engines[0], transports[0])
    decode = DecodeWorker(engines[1], transports[1])
    yield Workers(prefill, decode, engines[0].engine.tokenizer)
    asyncio.run(decode.shutdown())
    asyncio.run(prefill.shutdown())
    for transport in transports:
        transport.close()


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[list[int], str]]:
    llm = LLM(MODEL.name, max_model_len=512, kv_cache_memory_bytes=16 << 20)
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    outputs = llm.generate(prompt_token_ids=list(PROMPTS.values()), sampling_params=greedy)
    return {
        name: (list(out.token_ids), out.text) for name, out in zip(PROMPTS, outputs, strict=True)
    }


def make_app(workers: Workers, prefill: SpyPrefill, decode: SpyDecode) -> FastAPI:
    settings = IngressSettings(
        served_model_names=("tiny-llama",),
        max_model_len=512,
        block_size=ENGINE.block_size,
        hash_seed=ENGINE.hash_seed,
        disaggregation=DisaggregationConfig(local_prefill_threshold_tokens=THRESHOLD_TOKENS),
    )
    return create_app([ModelEndpoint(workers.tokenizer, prefill, decode, settings)]).asgi


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_output_matches_offline_llm(
    workers: Workers, reference: dict[str, tuple[list[int], str]], stream: bool
) -> None:
    prefill, decode = SpyPrefill(workers.prefill), SpyDecode(workers.decode)
    app = make_app(workers, prefill, decode)

    async def ask(prompt: list[int]) -> tuple[str, str, str]:
        body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": MAX_TOKENS,
                "temperature": 0, "stream": stream}  # fmt: skip
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://e2e") as client:
            r = await client.post("/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        if not stream:
            return r.json()["id"], r.json()["choices"][0]["text"], r.text
        chunks = sse_payloads(r.text)
        assert chunks[-1] == "[DONE]"
        text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
        return chunks[0]["id"], text, r.text

    for name, prompt in PROMPTS.items():
        request_id, text, raw = run(ask(prompt), timeout_s=60)
        expected_ids, expected_text = reference[name]
        streamed = decode.token_ids[request_id]
        if name == "remote":
            streamed = [prefill.first_token_ids[request_id], *streamed]
        else:
            assert request_id not in prefill.first_token_ids
        assert streamed == expected_ids, (name, raw)
        assert text == expected_text

    def idle() -> bool:
        return all(
            w.stats().kv_blocks_used == 0 and w.stats().exports_pinned == 0
            for w in (workers.prefill, workers.decode)
        )

    run(async_wait_until(idle))


@pytest.mark.parametrize("name", list(PROMPTS))
def test_a_character_split_across_the_first_two_tokens_survives_the_handoff(
    workers: Workers, name: str
) -> None:
    # "é" is two byte tokens: on the remote path the prefill samples the first, decode the
    # second; the text must come out whole, as one engine would render it
    prefill, decode = SpyPrefill(workers.prefill), SpyDecode(workers.decode)
    app = make_app(workers, prefill, decode)
    body = {"model": "tiny-llama", "prompt": PROMPTS[name], "max_tokens": 8, "temperature": 0,
            "guided_choice": ["é!"]}  # fmt: skip

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://e2e") as client:
            return await client.post("/v1/completions", json=body, timeout=30)

    response = run(ask(), timeout_s=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == "é!"
    assert (name == "remote") == bool(prefill.first_token_ids)
