"""The happy paths of the prefill -> decode handoff, over the in-process and gRPC transports:
token-identical greedy output against the offline ``LLM``, local prefill, pulls that skip the
blocks the decode side already caches, and first tokens that end a request."""

from __future__ import annotations

import asyncio
import json

import pytest

from core.codec import from_plain, to_plain
from core.ids import new_request_id
from core.sampling import SamplingParams
from core.stats import ReplicaStats
from engine.engine import LLMEngine
from tests.unit.decode.helpers import collect, decode_request, handoff, prefill
from tests.unit.decode.pd_pair import Pair
from tests.unit.engine.async_engine.tiny_engine import (
    BLOCK_SIZE,
    GREEDY,
    PROMPTS,
    reset_prefix_cache,
)
from transfer import InMemoryTransferMetrics, TransferSide

pytestmark = pytest.mark.timeout(60)


def _import_bytes(pair: Pair) -> int:
    metrics = getattr(pair.decode.transport, "metrics", None)
    assert isinstance(metrics, InMemoryTransferMetrics)
    return metrics.snapshot().bytes_total.get(TransferSide.IMPORT, 0)


def test_disaggregated_greedy_matches_llm(pair: Pair, reference: dict[str, list[int]]) -> None:
    async def main() -> None:
        await reset_prefix_cache(pair.decode.engine)
        for name, prompt in PROMPTS.items():
            got = await handoff(pair.prefill, pair.decode, new_request_id(), prompt, GREEDY)
            assert got.prefill.kv_handle is not None
            assert got.prefill.kv_handle.num_blocks == -(-len(prompt) // BLOCK_SIZE)
            assert got.token_ids == reference[name], name
            # one chunk per engine step: a lone request gets one token per step
            assert [len(c.token_ids) for c in got.chunks] == [1] * (len(reference[name]) - 1)
            assert got.chunks[-1].finished and got.chunks[-1].finish_reason == "length"
            assert all(c.num_prompt_tokens == len(prompt) for c in got.chunks)
            assert all(c.num_cached_tokens == len(prompt) for c in got.chunks)
            assert all(c.error is None for c in got.chunks)

    asyncio.run(main())
    metrics = pair.decode.transport.metrics
    assert isinstance(metrics, InMemoryTransferMetrics)
    paths = metrics.snapshot().pulls_by_path or {}
    assert set(paths) == {"grpc" if pair.kind == "grpc" else "same_node"}, paths


def test_concurrent_handoffs_match_llm(pair: Pair, reference: dict[str, list[int]]) -> None:
    async def main() -> None:
        names = list(PROMPTS)
        results = await asyncio.gather(
            *(
                handoff(pair.prefill, pair.decode, new_request_id(), PROMPTS[n], GREEDY)
                for n in names
            )
        )
        for name, got in zip(names, results, strict=True):
            assert got.token_ids == reference[name], name

    asyncio.run(main())


def test_disaggregated_text_matches_detokenized_ids(pair: Pair) -> None:
    async def main() -> None:
        prompt = PROMPTS["len33"]
        got = await handoff(pair.prefill, pair.decode, new_request_id(), prompt, GREEDY)
        tokenizer = pair.decode.engine.engine.tokenizer
        assert got.text == tokenizer.decode(got.token_ids)

    asyncio.run(main())


def test_local_prefill_matches_llm(pair: Pair, reference: dict[str, list[int]]) -> None:
    async def main() -> None:
        for name in ("len5", "len70"):
            prompt = PROMPTS[name]
            chunks = await collect(
                pair.decode, decode_request(new_request_id(), prompt, GREEDY, None)
            )
            assert [t for c in chunks for t in c.token_ids] == reference[name]
            assert [len(c.token_ids) for c in chunks] == [1] * len(reference[name])
            assert chunks[-1].finished and chunks[-1].finish_reason == "length"
            assert all(c.num_prompt_tokens == len(prompt) for c in chunks)

    asyncio.run(main())


@pytest.mark.parametrize(("name", "num_local_blocks"), [("len70", 4), ("len64", 4)])
def test_local_prefix_hit_pulls_only_missing_blocks(
    pair: Pair, reference: dict[str, list[int]], name: str, num_local_blocks: int
) -> None:
    """A second request with the same prompt finds its full blocks cached on decode: it pulls
    only the partial last block (len70) or nothing at all (len64), and the prefill side still
    frees the whole export."""
    prompt = PROMPTS[name]
    num_blocks = -(-len(prompt) // BLOCK_SIZE)

    async def main() -> None:
        await reset_prefix_cache(pair.decode.engine)
        before = _import_bytes(pair)
        first = await handoff(pair.prefill, pair.decode, new_request_id(), prompt, GREEDY)
        assert _import_bytes(pair) - before == num_blocks * pair.block_bytes
        assert first.token_ids == reference[name]

        before = _import_bytes(pair)
        second = await handoff(pair.prefill, pair.decode, new_request_id(), prompt, GREEDY)
        pulled = num_blocks - num_local_blocks
        assert _import_bytes(pair) - before == pulled * pair.block_bytes
        assert second.token_ids == reference[name]
        assert second.chunks[0].num_cached_tokens == len(prompt)

    asyncio.run(main())


def test_max_tokens_1_pins_nothing(pair: Pair) -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    result = asyncio.run(prefill(pair.prefill, new_request_id(), PROMPTS["len33"], params))
    assert result.kv_handle is None and result.finish_reason == "length"
    assert pair.prefill.stats().exports_pinned == 0


def test_stop_token_as_first_token_pins_nothing(
    pair: Pair, reference: dict[str, list[int]]
) -> None:
    first_token_id = reference["len33"][0]
    params = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(first_token_id,))
    result = asyncio.run(prefill(pair.prefill, new_request_id(), PROMPTS["len33"], params))
    assert result.kv_handle is None and result.finish_reason == "stop"
    assert result.first_token_id == first_token_id and result.first_text == ""
    assert pair.prefill.stats().exports_pinned == 0


def test_stats_are_typed_and_cross_the_codec_unchanged(pair: Pair) -> None:
    assert isinstance(pair.prefill.engine.engine, LLMEngine)
    assert pair.prefill.engine.engine is not pair.decode.engine.engine
    stats = pair.decode.stats()
    assert isinstance(stats, ReplicaStats) and isinstance(pair.prefill.stats(), ReplicaStats)
    assert from_plain(ReplicaStats, json.loads(json.dumps(to_plain(stats)))) == stats
    assert stats.kv_blocks_total == pair.decode.engine.engine.parts.storage.num_blocks - 1
    assert stats.kv_blocks_free + stats.kv_blocks_used == stats.kv_blocks_total
