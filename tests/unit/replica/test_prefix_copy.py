"""A hot prefix copied between two real engines of the built-in tiny model, in one process: the
holder exports its cached blocks by hash (pinned until the pull ends, fails or the lease
expires), the target pulls them over the in-process transport into its host tier, and a request
with that prefix on the target then onloads them as host hits and answers exactly as the
holder did."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest

from core.codec import from_plain, to_plain
from core.config import (
    EngineConfig,
    HostTierConfig,
    KVTiersConfig,
    TransferConfig,
)
from core.errors import MessageError, TransferError
from core.hashing import hash_block, root_hash
from core.ids import new_request_id
from core.messages import PrefixExport, WarmPrefixRequest
from engine.async_engine import AsyncEngine
from replica.prefix_admit import EnginePrefixAdmitter
from replica.prefix_copies import PrefixCopies
from replica.prefix_export import PrefixExporter
from replica.prefix_pull import TransportPrefixSource
from replica.prefix_warming import PrefixWarmer, WarmPrefixResult
from tests.unit.engine.async_engine.tiny_engine import (
    GREEDY,
    check_integrity,
    num_pinned_prefix_blocks,
    random_prompt,
    two_engines,
)
from tests.waiting import async_wait_until
from transfer import FaultInjection, GrpcKVTransport, InProcKVHub, InProcKVTransport
from transfer.block_store import BlockStore

pytestmark = pytest.mark.timeout(120)

ENGINE = EngineConfig(
    max_model_len=512,
    kv_cache_memory_bytes=16 << 20,
    kv_tiers=KVTiersConfig(host=HostTierConfig(bytes=4 << 20)),
)
BLOCK = ENGINE.block_size
PROMPT = random_prompt(4 * BLOCK + 7, seed=45)  # 4 full blocks and a partial one


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[AsyncEngine, AsyncEngine]]:
    with two_engines(ENGINE) as both:
        yield both


async def _generate(engine: AsyncEngine, prompt: list[int]) -> list[int]:
    outputs = [out async for out in engine.generate(new_request_id(), prompt, GREEDY)]
    return list(outputs[-1].token_ids)


async def _prompt_hashes(engine: AsyncEngine, prompt: list[int]) -> tuple[int, ...]:
    """The chained hashes of the prompt's full blocks, as ``engine`` hashes them."""
    seed = await engine.call(lambda llm: llm.scheduler.kv.hash_seed)
    hashes, parent = [], root_hash(seed, None, None)
    for start in range(0, len(prompt) - BLOCK + 1, BLOCK):
        parent = hash_block(parent, prompt[start : start + BLOCK])
        hashes.append(parent)
    return tuple(hashes)


def _request(hashes: tuple[int, ...]) -> WarmPrefixRequest:
    return WarmPrefixRequest("decode", hashes[0], hashes, "holder", "target")


def test_a_copied_prefix_is_a_host_hit_with_the_holders_output(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    holder, target = engines
    hub = InProcKVHub()
    holder_transport = InProcKVTransport(holder.engine.parts.storage, hub)

    def scratch_transport(store: BlockStore) -> InProcKVTransport:
        return InProcKVTransport(store, hub)

    async def main() -> None:
        reference = await _generate(holder, PROMPT)
        hashes = await _prompt_hashes(holder, PROMPT)
        assert len(hashes) == 4
        exporter = PrefixExporter(holder, holder_transport)
        export = await exporter.export(hashes)
        assert export is not None and export.block_hashes == hashes
        assert await num_pinned_prefix_blocks(holder) == 4 and exporter.num_live_exports == 1
        source = TransportPrefixSource(
            target.engine.parts.layout, scratch_transport, timeout_s=10.0
        )
        warmer = PrefixWarmer("target", "decode", source, EnginePrefixAdmitter(target))
        result = await warmer.warm(_request(hashes), export)
        block_bytes = target.engine.parts.layout.block_bytes
        assert result == WarmPrefixResult(4, 4, 4 * block_bytes, None)
        # the completed pull released the export: the holder's pins are gone
        await async_wait_until(lambda: exporter.num_live_exports == 0, timeout_s=10.0)
        assert await num_pinned_prefix_blocks(holder) == 0
        tiers = target.engine.scheduler.tiers
        assert tiers is not None
        assert await target.call(lambda _: tiers.find(list(hashes))) == 4
        onloaded_before = tiers.counters["host"].onload_blocks
        assert await _generate(target, PROMPT) == reference
        assert tiers.counters["host"].onload_blocks - onloaded_before == 4  # host hits
        await check_integrity(holder)
        await check_integrity(target)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=60.0))
    finally:
        holder_transport.close()


class RefusingTransport(InProcKVTransport):
    """Refuses every export, as a transport shutting down does."""

    def export(self, block_ids, on_release=None):  # type: ignore[no-untyped-def]
        raise TransferError("shutting down", reason="exporter_unavailable")


def _end_export(holder: AsyncEngine, end: str) -> None:
    """Export the cached prompt, end the export as ``end`` says and check the holder's pins
    are gone (waiting on a condition: the test fails on its timeout otherwise)."""
    hub = InProcKVHub()
    lease_s = 0.3 if end == "expired" else 30.0
    transport = InProcKVTransport(holder.engine.parts.storage, hub, lease_s=lease_s)
    if end == "faulty":
        transport.set_faults(FaultInjection(fail_after_chunks=0))
    exporter = PrefixExporter(holder, transport)

    async def main() -> None:
        await _generate(holder, PROMPT)
        hashes = await _prompt_hashes(holder, PROMPT)
        export = await exporter.export(hashes)
        assert export is not None and await num_pinned_prefix_blocks(holder) == len(hashes)
        if end == "released":  # the target gave up before pulling
            transport.release(export.handle)
        elif end == "faulty":  # the pull fails mid-stream
            source = TransportPrefixSource(
                holder.engine.parts.layout,
                lambda store: InProcKVTransport(store, hub),
                timeout_s=10.0,
            )
            with pytest.raises(TransferError):
                await source.pull(_request(hashes), export)
        await async_wait_until(lambda: exporter.num_live_exports == 0, timeout_s=10.0)
        assert await num_pinned_prefix_blocks(holder) == 0
        await check_integrity(holder)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=30.0))
    finally:
        transport.close()


@pytest.mark.parametrize("end", ["released", "expired", "faulty"])
def test_the_holders_pins_end_with_the_export(
    engines: tuple[AsyncEngine, AsyncEngine], end: str
) -> None:
    _end_export(engines[0], end)


def test_an_uncached_prefix_or_a_refused_export_pins_nothing(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    holder = engines[0]
    hub = InProcKVHub()
    refusing = RefusingTransport(holder.engine.parts.storage, hub)

    async def main() -> None:
        await _generate(holder, PROMPT)
        hashes = await _prompt_hashes(holder, PROMPT)
        exporter = PrefixExporter(holder, refusing)
        assert await exporter.export((12345, *hashes)) is None  # the first block is not cached
        with pytest.raises(TransferError, match="shutting down"):
            await exporter.export(hashes)
        assert exporter.num_live_exports == 0 and await num_pinned_prefix_blocks(holder) == 0
        await check_integrity(holder)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=30.0))
    finally:
        refusing.close()


def test_prefix_copies_cross_as_plain_data_and_check_their_address(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    holder, target = engines
    hub = InProcKVHub()
    holder_transport = InProcKVTransport(holder.engine.parts.storage, hub)
    target_transport = InProcKVTransport(target.engine.parts.storage, hub)

    def scratch(store: BlockStore) -> InProcKVTransport:
        return InProcKVTransport(store, hub)

    at_holder = PrefixCopies("holder", "decode", holder, holder_transport, scratch,
                             pull_timeout_s=10.0)  # fmt: skip
    at_target = PrefixCopies("target", "decode", target, target_transport, scratch,
                             pull_timeout_s=10.0)  # fmt: skip

    async def main() -> None:
        await _generate(holder, PROMPT)
        hashes = await _prompt_hashes(holder, PROMPT)
        request = WarmPrefixRequest("decode/m", hashes[0], hashes, "holder", "target")
        with pytest.raises(MessageError, match="reached decode replica target"):
            await at_target.export(request)  # the holder is another replica
        with pytest.raises(MessageError, match="prefill"):
            await at_holder.export(dataclasses.replace(request, pool="prefill"))
        export = await at_holder.export(from_plain(WarmPrefixRequest, to_plain(request)))
        assert export is not None
        wire = from_plain(PrefixExport, to_plain(export))
        result = await at_target.warm(request, wire)
        assert from_plain(WarmPrefixResult, to_plain(result)) == result
        assert result.num_blocks_admitted == len(hashes) and result.failure is None
        await async_wait_until(lambda: at_holder.exporter.num_live_exports == 0, timeout_s=10.0)
        await check_integrity(holder)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=30.0))
    finally:
        holder_transport.close()
        target_transport.close()


def test_a_prefix_copy_over_grpc(engines: tuple[AsyncEngine, AsyncEngine]) -> None:
    """The cluster's transports: the holder's serving gRPC transport, the target's import-only
    ones over scratch stores (the same-node path off: the bytes cross the wire)."""
    holder, target = engines
    transfer = TransferConfig(
        bind_host="127.0.0.1",
        insecure_test_token="prefix-copy-test",
        pull_deadline_s=10.0,
        rpc_deadline_s=2.0,
        same_node="off",
    )
    serving = GrpcKVTransport(holder.engine.parts.storage, transfer, serve=True)

    def scratch(store: BlockStore) -> GrpcKVTransport:
        return GrpcKVTransport(store, transfer, serve=False)

    at_holder = PrefixCopies("holder", "decode", holder, serving, scratch, pull_timeout_s=10.0)
    at_target = PrefixCopies("target", "decode", target, serving, scratch, pull_timeout_s=10.0)

    async def main() -> None:
        await _generate(holder, PROMPT)
        hashes = await _prompt_hashes(holder, PROMPT)
        request = WarmPrefixRequest("decode", hashes[0], hashes, "holder", "target")
        export = await at_holder.export(request)
        assert export is not None and export.handle.address == serving.address
        result = await at_target.warm(request, export)
        block_bytes = target.engine.parts.layout.block_bytes
        assert result == WarmPrefixResult(4, 4, 4 * block_bytes, None)
        await async_wait_until(lambda: at_holder.exporter.num_live_exports == 0, timeout_s=10.0)
        assert await num_pinned_prefix_blocks(holder) == 0
        await check_integrity(holder)

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=30.0))
    finally:
        serving.close()
