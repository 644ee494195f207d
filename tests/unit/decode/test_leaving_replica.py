"""A leaving decode replica hands a stream off, between two real engines of the built-in tiny
model without host tiers: asked to, the holder stops the request it is decoding and ends the
stream with an aborted chunk carrying the export of its computed blocks (prompt and tokens so
far); the replica that continues it pulls them straight into its device prefix cache, prefills
only what they miss, and the whole output equals one uninterrupted greedy run. Nothing stays
pinned on either side, and a request not decoding yet is left where it is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator

import pytest

from core.config import EngineConfig
from core.ids import new_request_id
from core.messages import DecodeRequest, TokenChunk
from core.sampling import SamplingParams
from decode.worker import DecodeWorker
from engine.async_engine import AsyncEngine
from replica.prefix_copies import PrefixCopies
from replica.prefix_export import PrefixExporter
from tests.unit.engine.async_engine.tiny_engine import (
    PROMPTS,
    check_integrity,
    num_pinned_prefix_blocks,
    reset_prefix_cache,
    two_engines,
)
from tests.waiting import async_wait_until
from transfer import InProcKVHub, InProcKVTransport
from transfer.block_store import BlockStore

pytestmark = pytest.mark.timeout(120)

ENGINE = EngineConfig(max_model_len=512, kv_cache_memory_bytes=16 << 20)  # no host tier
BLOCK = ENGINE.block_size
PROMPT = PROMPTS["len70"]
LONG = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[AsyncEngine, AsyncEngine]]:
    with two_engines(ENGINE) as both:
        yield both


async def _run(stream: AsyncGenerator[TokenChunk, None]) -> list[TokenChunk]:
    return [chunk async for chunk in stream]


def test_a_handed_off_stream_continues_on_another_replica_from_its_pulled_blocks(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    holder_engine, target_engine = engines
    hub = InProcKVHub()
    holder_transport = InProcKVTransport(holder_engine.engine.parts.storage, hub)
    target_transport = InProcKVTransport(target_engine.engine.parts.storage, hub)
    holder = DecodeWorker(holder_engine, holder_transport)
    target = DecodeWorker(target_engine, target_transport)
    exporter = PrefixExporter(holder_engine, holder_transport)

    def scratch(store: BlockStore) -> InProcKVTransport:
        return InProcKVTransport(store, hub)

    copies = PrefixCopies("target", "decode", target_engine, target_transport, scratch,
                          pull_timeout_s=10.0)  # fmt: skip

    async def main() -> None:
        whole = await _run(target.generate(DecodeRequest(new_request_id(), PROMPT, LONG)))
        reference = [t for chunk in whole for t in chunk.token_ids]
        assert len(reference) == LONG.max_tokens
        await reset_prefix_cache(target_engine)  # the continuation finds only what it pulls

        # the holder decodes; once 20 tokens are out it is asked to leave
        chunks: list[TokenChunk] = []
        handing_off: asyncio.Task[int] | None = None
        async for chunk in holder.generate(DecodeRequest("leaving", PROMPT, LONG)):
            chunks.append(chunk)
            if handing_off is None and sum(len(c.token_ids) for c in chunks) >= 20:
                handing_off = asyncio.create_task(holder.hand_off(exporter))
        assert handing_off is not None and await handing_off == 1
        assert holder.stats().handoffs_total == 1
        last = chunks[-1]
        assert last.finished and last.finish_reason == "abort" and last.handoff is not None
        sent = [t for chunk in chunks for t in chunk.token_ids]
        assert 20 <= len(sent) < LONG.max_tokens and sent == reference[: len(sent)]
        export = last.handoff
        # every full block of the tokens computed: all but the last one sampled
        assert export.handle.num_blocks == (len(PROMPT) + len(sent) - 1) // BLOCK

        # the continuation: pulled into the target's device cache (no host tier), then only
        # the last partial block prefilled
        pulled = await copies.pull_handed_off(export)
        assert pulled.failure is None and pulled.num_blocks_admitted == export.handle.num_blocks
        await async_wait_until(lambda: exporter.num_live_exports == 0, timeout_s=10.0)
        assert (
            await num_pinned_prefix_blocks(holder_engine) == 0
        )  # the pull released the holder's pin
        owed = LONG.max_tokens - len(sent)
        rest = SamplingParams(max_tokens=owed, temperature=0.0, ignore_eos=True)
        continued = await _run(target.generate(DecodeRequest("cont", PROMPT + sent, rest)))
        assert continued[0].num_cached_tokens == export.handle.num_blocks * BLOCK
        assert sent + [t for chunk in continued for t in chunk.token_ids] == reference
        await check_integrity(holder_engine)
        await check_integrity(target_engine)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=90.0))
    finally:
        holder_transport.close()
        target_transport.close()


def test_a_handoff_stops_only_requests_decoding_here(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    holder_engine, _ = engines
    hub = InProcKVHub()
    transport = InProcKVTransport(holder_engine.engine.parts.storage, hub)
    holder = DecodeWorker(holder_engine, transport)
    exporter = PrefixExporter(holder_engine, transport)

    async def main() -> None:
        # nothing streams: nothing to hand off
        assert await holder.hand_off(exporter) == 0
        # an unknown request (its stream open, the engine never saw it) is not stopped
        assert await exporter.hand_off("never-added") == (False, None)
        # a finished stream's chunks are its own: no handoff attached
        done = await _run(holder.generate(DecodeRequest(new_request_id(), PROMPTS["len16"], LONG)))
        assert done[-1].finish_reason == "length" and done[-1].handoff is None
        await check_integrity(holder_engine)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=60.0))
    finally:
        transport.close()
