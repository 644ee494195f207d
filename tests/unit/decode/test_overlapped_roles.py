"""Both roles with overlapped steps (``engine.async_scheduling: on``), on the CPU: the prefill
worker's pinned first token, the pull and the decode worker's stream give what the offline LLM
gives, one by one and concurrently, and both engines end quiescent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from core.ids import new_request_id
from decode.build import build_decode_worker
from prefill.build import build_prefill_worker
from tests.unit.decode.helpers import handoff
from tests.unit.decode.pd_pair import TRANSFER, Pair, assert_quiescent, make_pair
from tests.unit.engine.async_engine.tiny_engine import ENGINE, GREEDY, MODEL, PROMPTS

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def overlapped_pair() -> Iterator[Pair]:
    engine = ENGINE.model_copy(update={"async_scheduling": "on"})
    prefill = build_prefill_worker(MODEL, engine, TRANSFER)
    wire = TRANSFER.model_copy(update={"same_node": "off"})
    decode = build_decode_worker(MODEL, engine, wire, kv_failure_policy="recompute")
    assert prefill.engine.engine.async_scheduling and decode.engine.engine.async_scheduling
    pair = make_pair("inproc", prefill, decode)
    try:
        yield pair
        assert_quiescent(pair)
    finally:
        for transport in pair.closables:
            transport.close()
        asyncio.run(decode.shutdown())
        asyncio.run(prefill.shutdown())


def test_handoffs_with_overlapped_steps_match_llm(
    overlapped_pair: Pair, reference: dict[str, list[int]]
) -> None:
    pair = overlapped_pair

    async def main() -> None:
        for name, prompt in PROMPTS.items():
            got = await handoff(pair.prefill, pair.decode, new_request_id(), prompt, GREEDY)
            assert got.token_ids == reference[name], name
            assert got.chunks[-1].finished and got.chunks[-1].finish_reason == "length"
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


def test_a_prefill_with_overlapped_steps_caches_its_prompt(overlapped_pair: Pair) -> None:
    """The second time a prompt comes, the prefill serves its full blocks from the cache."""
    pair, prompt = overlapped_pair, list(range(3, 73))  # a prompt no other test sends

    async def main() -> list[int]:
        results = [
            await handoff(pair.prefill, pair.decode, new_request_id(), prompt, GREEDY)
            for _ in range(2)
        ]
        return [r.prefill.num_cached_tokens for r in results]

    assert asyncio.run(main()) == [0, 64]
