"""P/D between pools of different tensor-parallel sizes, on the CPU with real gangs (gloo follower
processes) and the real builders over gRPC: a TP=2 prefill hands off to a TP=1 decode and a TP=1
prefill to a TP=2 decode. Every decode rank pulls exactly its KV heads; outputs equal the
offline one-rank ``LLM``; the bytes moved are the whole prompt's KV once; prefix hits on the
decode side still skip blocks; both sides end quiescent; then a follower killed after the
prefill costs no request on a prefill gang and ends the request cleanly on a decode gang.

One process holds one gang (a process joins one process group), so each pair is built, used
and shut down in turn. The TP=4 -> TP=2 combination runs between replicas under Serve
(``tests/integration/test_tensor_parallel.py``) and head by head in ``test_shards``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from core.errors import UnavailableError
from core.ids import new_request_id
from core.messages import PrefillResult, TokenChunk
from core.stats import TransferStats
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from engine.gangs.tp_gang import Gang
from engine.gangs.tp_step import LeaderRunner
from prefill.build import build_prefill_worker
from prefill.worker import PrefillWorker
from tests.unit.decode.helpers import collect, decode_request, handoff, prefill
from tests.unit.decode.pd_pair import TRANSFER, Pair, assert_quiescent, make_pair
from tests.unit.engine.async_engine.tiny_engine import ENGINE, GREEDY, MODEL, PROMPTS
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

WIRE = TRANSFER.model_copy(update={"same_node": "off"})
FULL_BLOCK_BYTES = 32768  # tiny-llama: 4 layers x K,V x 16 tokens x 2 KV heads x 32 x fp32


def build(prefill_tp: int, decode_tp: int) -> Pair:
    prefill_engine = ENGINE.model_copy(update={"tensor_parallel_size": prefill_tp})
    decode_engine = ENGINE.model_copy(update={"tensor_parallel_size": decode_tp})
    prefill_worker = build_prefill_worker(MODEL, prefill_engine, WIRE)
    try:
        decode = build_decode_worker(MODEL, decode_engine, WIRE, kv_failure_policy="recompute")
    except BaseException:
        asyncio.run(prefill_worker.shutdown())
        raise
    return make_pair("grpc", prefill_worker, decode)


def shut_down(pair: Pair) -> None:
    asyncio.run(pair.decode.shutdown())
    asyncio.run(pair.prefill.shutdown())


def gang_of(worker: PrefillWorker | DecodeWorker) -> Gang:
    runner = worker.engine.engine.runner
    assert isinstance(runner, LeaderRunner) and runner.gang is not None
    return runner.gang


@pytest.fixture(params=[(2, 1), (1, 2)], ids=["tp2-to-tp1", "tp1-to-tp2"])
def hetero(request: pytest.FixtureRequest) -> Iterator[tuple[Pair, int, int]]:
    prefill_tp, decode_tp = request.param
    pair = build(prefill_tp, decode_tp)
    try:
        yield pair, prefill_tp, decode_tp
    finally:
        shut_down(pair)


def test_handoffs_between_tp_sizes_match_one_rank(
    hetero: tuple[Pair, int, int], reference: dict[str, list[int]]
) -> None:
    pair, prefill_tp, decode_tp = hetero

    def transfer() -> TransferStats:
        return pair.decode.stats().transfer

    async def main() -> int:
        moved_blocks = 0
        for name, prompt in PROMPTS.items():
            got = await handoff(pair.prefill, pair.decode, new_request_id(), prompt, GREEDY)
            assert got.token_ids == reference[name], name
            assert got.prefill.kv_handle is not None
            assert got.prefill.kv_handle.tp_size == prefill_tp
            moved_blocks += got.prefill.kv_handle.num_blocks
        # a prompt sharing the longest one's first blocks: the decode gang reuses them per rank
        long = PROMPTS["len150"]
        shared = [*long[:128], 7, 8, 9]
        before = transfer().bytes_total
        local = await collect(pair.decode, decode_request(new_request_id(), shared, GREEDY, None))
        remote = await handoff(pair.prefill, pair.decode, new_request_id(), shared, GREEDY)
        assert remote.token_ids[1:] == [t for c in local for t in c.token_ids][1:]
        pulled = transfer().bytes_total - before
        assert pulled == FULL_BLOCK_BYTES  # only the block past the 8 the decode caches
        return moved_blocks

    moved_blocks = asyncio.run(main())
    stats = transfer()
    assert stats.failures_total == 0
    # every block's KV crossed exactly once, whatever the sizes (the benchmark's ratio of 1.0)
    assert stats.bytes_total == (moved_blocks + 1) * FULL_BLOCK_BYTES
    assert_quiescent(pair)
    assert pair.decode.engine.engine.parts.layout.tp_size == decode_tp
    if prefill_tp > 1:
        killed_prefill_follower(pair, reference)
    else:
        killed_decode_follower(pair)


async def handoff_after_a_kill(
    pair: Pair, victim: PrefillWorker | DecodeWorker
) -> tuple[PrefillResult, list[TokenChunk]]:
    """Prefill ``len70``, SIGKILL the first follower of ``victim``'s gang, then decode it."""
    prompt, request_id = PROMPTS["len70"], new_request_id()
    result = await prefill(pair.prefill, request_id, prompt, GREEDY)
    follower = gang_of(victim).processes[0]
    os.kill(follower.pid, signal.SIGKILL)
    follower.wait()
    chunks = await collect(pair.decode, decode_request(request_id, prompt, GREEDY, result))
    return result, chunks


def killed_prefill_follower(pair: Pair, reference: dict[str, list[int]]) -> None:
    """The follower's KV stays mapped in rank 0's process: a handle issued before the kill is
    still pulled whole; the gang's next step fails and the replica reports itself unusable."""

    async def main() -> None:
        result, chunks = await handoff_after_a_kill(pair, pair.prefill)
        tokens = [result.first_token_id] + [t for c in chunks for t in c.token_ids]
        assert tokens == reference["len70"]
        with pytest.raises(UnavailableError, match="rank 0"):
            await prefill(pair.prefill, new_request_id(), PROMPTS["len33"], GREEDY)

    asyncio.run(main())
    assert wait_until(lambda: not pair.prefill.engine.engine.usable, 10)
    assert wait_until(lambda: pair.prefill.stats().exports_pinned == 0, 10)
    assert wait_until(lambda: pair.decode.stats().kv_blocks_used == 0, 10)


def killed_decode_follower(pair: Pair) -> None:
    """The pull lands in the dead follower's mapped KV, then the request's first step fails:
    it ends with an error naming the rank, its blocks freed on both sides."""
    _, chunks = asyncio.run(handoff_after_a_kill(pair, pair.decode))
    error = chunks[-1].error
    assert chunks[-1].finished and error is not None and "rank" in error.message
    assert wait_until(lambda: pair.prefill.stats().exports_pinned == 0, 10)
    assert wait_until(lambda: pair.decode.stats().kv_blocks_used == 0, 10)
    assert wait_until(lambda: pair.prefill.stats().kv_blocks_used == 0, 10)
