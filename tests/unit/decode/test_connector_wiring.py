"""The role workers through the KV connector, end to end: the one-shot and the pipelined
hand-off give the tokens of a colocated (local-prefill) decode, and a reservation that waits for
free blocks far longer than the export's lease keeps the export alive by heartbeats."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from core.ids import new_request_id
from core.kv_handle import KVHandle
from core.messages import DecodeRequest, PrefillRequest, PrefillResult, PrefillStarted
from decode.worker import DecodeWorker
from prefill.worker import PrefillWorker
from tests.unit.decode.helpers import collect, decode_request, prefill
from tests.unit.decode.pd_pair import Pair
from tests.unit.decode.test_pressure import _fill_decode_pool
from tests.unit.engine.async_engine.tiny_engine import GREEDY, PROMPTS, reset_prefix_cache
from tests.waiting import async_wait_until
from transfer import InProcKVTransport

pytestmark = pytest.mark.timeout(120)


async def _pipelined(pair: Pair, request_id: str, prompt: list[int]) -> tuple[KVHandle, list[int]]:
    updates = pair.prefill.prefill_stream(PrefillRequest(request_id, prompt, GREEDY))
    async with aclosing(updates):
        started = await anext(updates)
        assert isinstance(started, PrefillStarted)
        request = DecodeRequest(request_id, prompt, GREEDY, kv_handle=started.kv_handle)
        decoding = asyncio.create_task(collect(pair.decode, request))
        result = await anext(updates)
        assert isinstance(result, PrefillResult)
    chunks = await decoding
    assert all(c.error is None for c in chunks), chunks[-1]
    return started.kv_handle, [result.first_token_id] + [t for c in chunks for t in c.token_ids]


@pytest.mark.parametrize("name", ["len16", "len70", "len150"])
def test_one_shot_and_pipelined_handoffs_match_a_colocated_decode(pair: Pair, name: str) -> None:
    prompt = PROMPTS[name]

    async def main() -> None:
        local = await collect(pair.decode, decode_request(new_request_id(), prompt, GREEDY, None))
        colocated = [t for c in local for t in c.token_ids]
        await reset_prefix_cache(pair.decode.engine)  # the next imports pull every block
        request_id = new_request_id()
        result = await prefill(pair.prefill, request_id, prompt, GREEDY)
        assert result.kv_handle is not None and not result.kv_handle.pipelined  # one-shot
        chunks = await collect(pair.decode, decode_request(request_id, prompt, GREEDY, result))
        one_shot = [result.first_token_id] + [t for c in chunks for t in c.token_ids]
        await reset_prefix_cache(pair.decode.engine)
        handle, pipelined = await _pipelined(pair, new_request_id(), prompt)
        assert handle.pipelined
        assert one_shot == colocated and pipelined == colocated

    asyncio.run(main())


@pytest.mark.parametrize("pair", ["inproc"], indirect=True)
def test_a_long_reservation_keeps_the_export_alive_by_heartbeats(pair: Pair) -> None:
    """The decode pool stays full for several leases of the export; the import's heartbeats
    keep it alive, and it is pulled once blocks are free."""
    assert pair.hub is not None
    lease_s = 0.6
    exporter = InProcKVTransport(pair.prefill.engine.engine.parts.storage, pair.hub,
                                 lease_s=lease_s)  # fmt: skip
    pair.closables.append(exporter)
    short_lease = PrefillWorker(pair.prefill.engine, exporter)
    pair.extra.append(short_lease)
    heartbeats: list[int] = []
    importer = pair.decode.transport
    beat = importer.heartbeat

    def counting_heartbeat(handle: KVHandle) -> int:
        heartbeats.append(1)
        return beat(handle)

    decode = DecodeWorker(pair.decode.engine, importer, reserve_timeout_s=30.0)

    async def main() -> list[int]:
        fillers = await _fill_decode_pool(pair)
        try:
            request_id, prompt = new_request_id(), PROMPTS["len70"]
            result = await prefill(short_lease, request_id, prompt, GREEDY)
            consumer = asyncio.ensure_future(
                collect(decode, decode_request(request_id, prompt, GREEDY, result))
            )
            # heartbeats come about every lease_s / 3: six of them outlast the lease twice over
            assert await async_wait_until(lambda: len(heartbeats) >= 6, timeout_s=20.0)
            assert decode.stats().imports_in_progress == 1
        finally:
            for stream in fillers:
                stream.close()
        chunks = await asyncio.wait_for(consumer, timeout=20.0)
        assert all(c.error is None for c in chunks), chunks[-1]
        return [result.first_token_id] + [t for c in chunks for t in c.token_ids]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importer, "heartbeat", counting_heartbeat)
        tokens = asyncio.run(main())
    assert len(tokens) == GREEDY.max_tokens
    assert short_lease.stats().transfer.leases_expired_total == 0
