"""A replica warming a hot prefix: pulled blocks land in its host tier as a leading run, and
every way it can go short is a result, not an exception."""

from __future__ import annotations

import asyncio

import pytest
import torch

from core.config import HostTierConfig, KVTiersConfig
from core.errors import MessageError, TransferError
from core.kv_handle import KVHandle
from core.kv_layout import KVLayout
from core.messages import PrefixExport, WarmPrefixRequest
from engine.kv.tiers.device_rows import DeviceRows
from engine.kv.tiers.store import KVTiers
from replica.prefix_warming import PrefixWarmer, PulledBlocks, WarmPrefixResult

LAYOUT = KVLayout("m", "float32", 4, 1, 1, 2, 0)  # 64-byte blocks
B = LAYOUT.block_bytes
REQUEST = WarmPrefixRequest("decode", 11, (11, 12, 13), "holder", "me", num_bytes=3 * B)
EXPORT = PrefixExport((11, 12, 13), KVHandle("t", "inproc://0", 3, B, "f", 0, "e"))


class MemorySource:
    """The holder's cache as a dict; ``fail`` makes every pull fail."""

    def __init__(self, held: dict[int, torch.Tensor], fail: bool = False) -> None:
        self.held, self.fail = held, fail

    async def pull(self, request: WarmPrefixRequest, export: PrefixExport) -> PulledBlocks:
        if self.fail:
            raise TransferError("source unreachable", reason="unavailable")
        hashes = []
        for block_hash in request.block_hashes:
            if block_hash not in self.held:
                break
            hashes.append(block_hash)
        return PulledBlocks(tuple(hashes), tuple(self.held[h] for h in hashes))


class TierAdmitter:
    """The engine side: ``KVTiers.admit`` (called directly: the test is its engine thread)."""

    def __init__(self, tiers: KVTiers) -> None:
        self.tiers = tiers

    async def admit(self, blocks: PulledBlocks) -> int:
        return self.tiers.admit(list(blocks.block_hashes), list(blocks.payloads))


def tiers(num_host_blocks: int = 4) -> KVTiers:
    config = KVTiersConfig(host=HostTierConfig(bytes=num_host_blocks * B))
    return KVTiers(config, LAYOUT, DeviceRows(torch.zeros((4, B), dtype=torch.uint8)))


def row(value: int) -> torch.Tensor:
    return torch.full((B,), value, dtype=torch.uint8)


def warm(source: MemorySource, engine: KVTiers, request: WarmPrefixRequest) -> WarmPrefixResult:
    warmer = PrefixWarmer("me", "decode", source, TierAdmitter(engine))
    return asyncio.run(asyncio.wait_for(warmer.warm(request, EXPORT), timeout=5.0))


def test_the_whole_prefix_lands_in_the_host_tier() -> None:
    engine = tiers()
    result = warm(MemorySource({11: row(1), 12: row(2), 13: row(3)}), engine, REQUEST)
    assert result == WarmPrefixResult(3, 3, 3 * B, None)
    assert engine.find([11, 12, 13]) == 3
    assert engine.host is not None and torch.equal(engine.host.buffer[0], row(1))
    engine.check_integrity()
    engine.close()


def test_a_source_holding_less_gives_a_leading_run() -> None:
    engine = tiers()
    result = warm(MemorySource({11: row(1), 13: row(3)}), engine, REQUEST)
    assert result == WarmPrefixResult(3, 1, B, "1 of 3 blocks pulled, 1 admitted")
    assert engine.find([11, 12]) == 1
    engine.close()


def test_a_full_pinned_tier_or_a_failed_pull_admits_nothing() -> None:
    engine = tiers(num_host_blocks=1)
    assert engine.host is not None
    engine.admit([99], [row(9)])
    engine.host.entries.pin(99)  # being read by a load: no victim
    result = warm(MemorySource({11: row(1), 12: row(2), 13: row(3)}), engine, REQUEST)
    assert result == WarmPrefixResult(3, 0, 0, "3 of 3 blocks pulled, 0 admitted")
    engine.host.entries.unpin(99)
    engine.close()
    failed = warm(MemorySource({}, fail=True), tiers(), REQUEST)
    assert failed == WarmPrefixResult(3, failure="pull failed: source unreachable")


def test_blocks_of_another_prefix_are_refused() -> None:
    class Liar(MemorySource):
        async def pull(self, request: WarmPrefixRequest, export: PrefixExport) -> PulledBlocks:
            return PulledBlocks((12,), (row(2),))

    engine = tiers()
    result = warm(Liar({}), engine, REQUEST)
    assert result.failure == "the source sent blocks of another prefix"
    assert engine.find([12]) == 0
    engine.close()


def test_a_request_for_another_replica_is_refused() -> None:
    other = WarmPrefixRequest("decode", 11, (11,), "holder", "someone-else")
    with pytest.raises(MessageError, match="someone-else"):
        warm(MemorySource({}), tiers(), other)
