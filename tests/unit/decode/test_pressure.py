"""Handoffs under pressure: a pull queued behind another keeps its export alive by heartbeats,
and an import waits for free KV blocks (or gives up cleanly after its reservation timeout)."""

from __future__ import annotations

import asyncio
import random

import pytest

from core.errors import KVCacheError
from core.ids import new_request_id
from decode.worker import DecodeWorker
from engine.request_stream import RequestStream
from prefill.worker import PrefillWorker
from tests.unit.decode.helpers import collect, decode_request, prefill
from tests.unit.decode.pd_pair import Pair
from tests.unit.engine.async_engine.tiny_engine import GREEDY, PROMPTS, reset_prefix_cache
from tests.waiting import async_wait_until
from transfer import FaultInjection, InProcKVTransport

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("pair", ["inproc"], indirect=True)]


def test_heartbeats_keep_a_queued_pull_alive(pair: Pair, reference: dict[str, list[int]]) -> None:
    """One import thread and a slow exporter: the second pull waits ~1.5 s in the queue, about
    twice its lease; heartbeats keep the export alive, so both pulls succeed. Each decode starts
    as soon as its prefill returns, so only the queue (not a slow CI machine) outlasts a lease."""
    assert pair.hub is not None
    prefill_storage = pair.prefill.engine.engine.parts.storage
    exporter = InProcKVTransport(
        prefill_storage,
        pair.hub,
        lease_s=0.8,
        chunk_bytes=2 * pair.block_bytes,
        faults=FaultInjection(delay_per_chunk_s=0.3),
    )
    importer = InProcKVTransport(pair.decode.engine.engine.parts.storage, pair.hub, num_threads=1)
    pair.closables += [exporter, importer]
    slow_prefill = PrefillWorker(pair.prefill.engine, exporter)
    pair.extra.append(slow_prefill)
    decode = DecodeWorker(pair.decode.engine, importer, kv_failure_policy="fail")

    async def main() -> None:
        await reset_prefix_cache(pair.decode.engine)
        names = ["len150", "len70"]
        ids = [new_request_id() for _ in names]
        results, streams = [], []
        for request_id, name in zip(ids, names, strict=True):
            result = await prefill(slow_prefill, request_id, PROMPTS[name], GREEDY)
            request = decode_request(request_id, PROMPTS[name], GREEDY, result)
            results.append(result)
            streams.append(asyncio.create_task(collect(decode, request)))
        all_chunks = await asyncio.gather(*streams)
        for name, result, chunks in zip(names, results, all_chunks, strict=True):
            assert all(c.error is None for c in chunks), chunks[-1]
            tokens = [result.first_token_id] + [t for c in chunks for t in c.token_ids]
            assert tokens == reference[name]

    asyncio.run(main())
    assert slow_prefill.stats().transfer.leases_expired_total == 0


async def _fill_decode_pool(pair: Pair) -> list[RequestStream]:
    """Reserve imports of long prompts until the decode pool is full."""
    await reset_prefix_cache(pair.decode.engine)
    rng = random.Random(7)
    fillers: list[RequestStream] = []
    while True:
        prompt = [rng.randrange(3, 250) for _ in range(480)]
        try:
            _, stream = await pair.decode.engine.open_import(new_request_id(), prompt, GREEDY, 5)
        except KVCacheError:
            return fillers
        fillers.append(stream)


def test_import_waits_for_free_blocks(pair: Pair, reference: dict[str, list[int]]) -> None:
    decode = DecodeWorker(pair.decode.engine, pair.decode.transport, reserve_timeout_s=10.0)

    async def main() -> None:
        fillers = await _fill_decode_pool(pair)
        try:
            request_id, prompt = new_request_id(), PROMPTS["len70"]
            result = await prefill(pair.prefill, request_id, prompt, GREEDY)
            consumer = asyncio.ensure_future(
                collect(decode, decode_request(request_id, prompt, GREEDY, result))
            )
            assert await async_wait_until(lambda: decode.stats().imports_in_progress == 1)
            assert pair.decode.engine.stats().num_waiting_for_kv == len(fillers)  # still waiting
        finally:
            for stream in fillers:
                stream.close()
        chunks = await asyncio.wait_for(consumer, timeout=10.0)
        tokens = [result.first_token_id] + [t for c in chunks for t in c.token_ids]
        assert tokens == reference["len70"]

    asyncio.run(main())


def test_import_that_finds_no_blocks_in_time_fails_cleanly(pair: Pair) -> None:
    decode = DecodeWorker(pair.decode.engine, pair.decode.transport, reserve_timeout_s=0.1)

    async def main() -> None:
        fillers = await _fill_decode_pool(pair)
        try:
            request_id, prompt = new_request_id(), PROMPTS["len70"]
            result = await prefill(pair.prefill, request_id, prompt, GREEDY)
            chunks = await collect(decode, decode_request(request_id, prompt, GREEDY, result))
        finally:
            for stream in fillers:
                stream.close()
        assert [(c.finished, c.error and c.error.kind) for c in chunks] == [(True, "KVCacheError")]
        # the unpulled export was released: the prefill side frees it without waiting for
        # the lease (the fixture checks the blocks)
        assert await async_wait_until(lambda: pair.prefill.stats().exports_pinned == 0)
        assert pair.prefill.stats().transfer.leases_expired_total == 0

    asyncio.run(main())


def test_a_draining_prefill_waits_for_its_exports_to_be_pulled(
    pair: Pair, reference: dict[str, list[int]]
) -> None:
    async def main() -> None:
        await reset_prefix_cache(pair.decode.engine)
        request_id = new_request_id()
        result = await prefill(pair.prefill, request_id, PROMPTS["len70"], GREEDY)
        # unpulled, the drain gives up at its bound and says how many exports are left
        assert await pair.prefill.drain(0.2) == 1
        draining = asyncio.create_task(pair.prefill.drain(30.0))
        chunks = await collect(
            pair.decode, decode_request(request_id, PROMPTS["len70"], GREEDY, result)
        )
        assert await asyncio.wait_for(draining, 10) == 0  # the pull released the export
        tokens = [result.first_token_id] + [t for c in chunks for t in c.token_ids]
        assert tokens == reference["len70"]

    asyncio.run(main())
