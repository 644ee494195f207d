"""KVTiers with a tiny layout and a hand-driven clock: exact ids through every move."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from core.config import DiskTierConfig, HostTierConfig, KVTiersConfig
from core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from core.kv_layout import KVLayout
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.tiers.device_rows import DeviceRows
from engine.kv.tiers.store import KVTiers

LAYOUT = KVLayout("m", "float32", 4, 1, 1, 2, 0)  # 64-byte blocks
B = LAYOUT.block_bytes
NUM_DEVICE_BLOCKS = 8


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def device() -> torch.Tensor:
    blocks = torch.zeros((NUM_DEVICE_BLOCKS, B), dtype=torch.uint8)
    for block_id in range(NUM_DEVICE_BLOCKS):
        blocks[block_id] = block_id * 10
    return blocks


def make(
    config: KVTiersConfig, blocks: torch.Tensor, clock: Clock
) -> tuple[KVTiers, list[KVEventBatch]]:
    batches: list[KVEventBatch] = []
    tiers = KVTiers(config, LAYOUT, DeviceRows(blocks), clock=clock)
    publisher = KVEventPublisher(batches.append)
    tiers.attach(publisher)
    return tiers, batches


def events(batches: list[KVEventBatch], publisher_flush: KVTiers) -> list[tuple[str, str, list]]:
    publisher_flush.moves.events.flush()
    out = []
    for batch in batches:
        for event in batch.events:
            if isinstance(event, BlockStored | BlockRemoved):
                kind = "stored" if isinstance(event, BlockStored) else "removed"
                out.append((kind, event.medium, list(event.block_hashes)))
    batches.clear()
    return out


def evict(tiers: KVTiers, block_id: int, block_hash: int, uses: int = 1) -> None:
    for _ in range(uses):
        tiers.moves.on_device_cached(block_id, block_hash)
    tiers.moves.on_device_evicted(block_id, block_hash)


def load(tiers: KVTiers, request_id: str, hashes: list[int], dst: list[int]) -> int:
    tiers.start_load(request_id, hashes, dst)
    finished = []
    while not finished:
        tiers.wait(5.0)
        finished = tiers.poll()
    (done,) = finished
    assert done.request_id == request_id
    return done.num_loaded


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_eviction_order_across_host_and_disk(tmp_path: Path, clock: Clock) -> None:
    config = KVTiersConfig(
        host=HostTierConfig(bytes=2 * B), disk=DiskTierConfig(path=str(tmp_path), bytes=10 * B)
    )
    tiers, batches = make(config, device(), clock)
    for block_id, block_hash in [(1, 101), (2, 102), (3, 103)]:
        clock.now += 1
        evict(tiers, block_id, block_hash)
    assert tiers.host is not None and tiers.disk is not None
    assert tiers.host.entries.hashes() == [102, 103]
    assert tiers.disk.entries.hashes() == [101]
    assert events(batches, tiers) == [
        ("stored", "host", [101]),
        ("stored", "host", [102]),
        ("stored", "disk", [101]),
        ("removed", "host", [101]),
        ("stored", "host", [103]),
    ]
    assert tiers.find([101, 102, 103, 104]) == 3
    assert tiers.find([104, 101]) == 0
    blocks = tiers.device_blocks
    assert load(tiers, "r", [101, 102, 103], [5, 6, 7]) == 3
    assert all(blocks.read(b).eq(v).all() for b, v in ((5, 10), (6, 20), (7, 30)))
    counters = tiers.counters
    assert (counters["host"].hits, counters["disk"].hits) == (2, 1)
    assert counters["disk"].onload_bytes == B
    tiers.check_integrity()
    tiers.close()


def test_evicting_a_block_already_below_copies_nothing(clock: Clock) -> None:
    tiers, batches = make(KVTiersConfig(host=HostTierConfig(bytes=4 * B)), device(), clock)
    evict(tiers, 1, 101)
    evict(tiers, 2, 101)
    assert tiers.counters["host"].offload_bytes == B
    assert events(batches, tiers) == [("stored", "host", [101])]
    tiers.close()


def test_write_through_copies_on_cache_and_on_evict_on_eviction(clock: Clock) -> None:
    through = KVTiersConfig(host=HostTierConfig(bytes=4 * B, write_policy="write_through"))
    tiers, _ = make(through, device(), clock)
    tiers.moves.on_device_cached(3, 103)
    assert tiers.host is not None and tiers.host.entries.hashes() == [103]
    tiers.close()
    lazy, _ = make(KVTiersConfig(host=HostTierConfig(bytes=4 * B)), device(), clock)
    lazy.moves.on_device_cached(3, 103)
    assert lazy.host is not None and len(lazy.host.entries) == 0
    lazy.moves.on_device_evicted(3, 103)
    assert lazy.host.entries.hashes() == [103]
    lazy.close()


def test_reuse_gate_keeps_one_off_blocks_out(tmp_path: Path, clock: Clock) -> None:
    config = KVTiersConfig(
        host=HostTierConfig(bytes=1 * B, min_reuse=2),
        disk=DiskTierConfig(path=str(tmp_path), bytes=4 * B, min_reuse=3),
    )
    tiers, _ = make(config, device(), clock)
    assert tiers.host is not None and tiers.disk is not None
    evict(tiers, 1, 101, uses=1)  # seen once: not worth the host tier
    assert len(tiers.host.entries) == 0
    evict(tiers, 2, 102, uses=2)
    assert tiers.host.entries.hashes() == [102]
    evict(tiers, 3, 103, uses=2)  # pushes 102 (2 uses) out: below the disk gate of 3
    assert tiers.host.entries.hashes() == [103] and len(tiers.disk.entries) == 0
    evict(tiers, 4, 104, uses=3)  # pushes 103 (2 uses) out: dropped
    evict(tiers, 5, 105, uses=3)  # pushes 104 (3 uses) out: written to disk
    assert tiers.disk.entries.hashes() == [104]
    tiers.close()


def test_ttls_demote_host_to_disk_then_delete(tmp_path: Path, clock: Clock) -> None:
    config = KVTiersConfig(
        host=HostTierConfig(bytes=4 * B),
        disk=DiskTierConfig(path=str(tmp_path), bytes=4 * B),
        host_ttl_s=10,
        disk_ttl_s=100,
    )
    tiers, batches = make(config, device(), clock)
    assert tiers.host is not None and tiers.disk is not None
    evict(tiers, 1, 101)
    clock.now += 5
    evict(tiers, 2, 102)
    clock.now += 6  # 101 idle 11 s, 102 idle 6 s
    tiers.moves.expire()
    assert tiers.host.entries.hashes() == [102]
    assert tiers.disk.entries.hashes() == [101]
    clock.now += 4  # a hit on 102 (the session's next turn) refreshes it
    assert load(tiers, "turn-2", [102], [7]) == 1
    clock.now += 9
    tiers.moves.expire()
    assert tiers.host.entries.hashes() == [102]
    clock.now += 100
    tiers.moves.expire()
    assert len(tiers.host.entries) == 0
    tiers.moves.expire()
    assert tiers.disk.entries.hashes() == [102]  # written 100 s ago; 101 expired
    assert tiers.counters["host"].ttl_expiries == 2
    assert tiers.counters["disk"].ttl_expiries == 1
    assert ("removed", "disk", [101]) in events(batches, tiers)
    tiers.close()
    assert [p.name for p in (tmp_path / "engine-0").glob("*.kvb")] == [f"{102:016x}.kvb"]


def test_corrupted_disk_block_is_a_miss_and_is_dropped(tmp_path: Path, clock: Clock) -> None:
    config = KVTiersConfig(disk=DiskTierConfig(path=str(tmp_path), bytes=4 * B))
    tiers, batches = make(config, device(), clock)
    evict(tiers, 1, 101)
    evict(tiers, 2, 102)
    tiers.io.disk(lambda: None).result()  # the writes are done
    path = tiers.disk.path_of(102) if tiers.disk is not None else None
    assert path is not None
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    events(batches, tiers)
    assert load(tiers, "r", [101, 102], [6, 7]) == 1  # 101 good, 102 refused
    assert tiers.device_blocks.read(6).eq(10).all()
    assert tiers.disk is not None and tiers.disk.entries.hashes() == [101]
    assert events(batches, tiers) == [("removed", "disk", [102])]
    tiers.check_integrity()
    tiers.close()


def test_warm_restart_reindexes_and_ignores_other_layouts(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    config = KVTiersConfig(disk=DiskTierConfig(path=str(tmp_path), bytes=8 * B))
    tiers, _ = make(config, device(), clock)
    evict(tiers, 1, 101)
    evict(tiers, 2, 102)
    tiers.close()  # the process "dies": lock released, files stay
    other = KVLayout("other-model", "float32", 4, 1, 1, 2, 0)
    from engine.kv.tiers.block_file import write_block_file

    write_block_file(tmp_path / "engine-0" / f"{103:016x}.kvb", other.fingerprint(), 103, bytes(B))
    blocks = torch.zeros((NUM_DEVICE_BLOCKS, B), dtype=torch.uint8)
    with caplog.at_level(logging.WARNING):
        again, batches = make(config, blocks, clock)
    assert again.disk is not None and sorted(again.disk.entries.hashes()) == [101, 102]
    assert "written with KV layout" in caplog.text
    assert again.disk.ignored_files == 1
    assert sorted(events(batches, again)[0][2]) == [101, 102]
    assert load(again, "r", [101, 102], [3, 4]) == 2
    assert blocks[3].eq(10).all() and blocks[4].eq(20).all()
    again.close()


def test_engines_sharing_a_path_get_their_own_directories(tmp_path: Path, clock: Clock) -> None:
    config = KVTiersConfig(disk=DiskTierConfig(path=str(tmp_path), bytes=8 * B))
    first, _ = make(config, device(), clock)
    second, _ = make(config, device(), clock)
    assert first.disk is not None and second.disk is not None
    assert first.disk.directory != second.disk.directory
    first.close()
    second.close()


def test_a_restarted_engine_claims_the_most_recently_written_free_directory(
    tmp_path: Path, clock: Clock
) -> None:
    config = KVTiersConfig(disk=DiskTierConfig(path=str(tmp_path), bytes=8 * B))
    older, _ = make(config, device(), clock)
    newer, _ = make(config, device(), clock)
    assert older.disk is not None and newer.disk is not None
    evict(newer, 1, 101)
    newer.io.disk(lambda: None).result()
    os.utime(older.disk.directory, (1_000.0, 1_000.0))  # written long ago
    newer_dir = newer.disk.directory
    older.close()
    newer.close()  # both die; the newer one just did
    again, _ = make(config, device(), clock)
    assert again.disk is not None and again.disk.directory == newer_dir
    assert again.disk.entries.hashes() == [101]
    again.close()


def test_admitted_blocks_of_a_pulled_prefix_load_like_host_hits(clock: Clock) -> None:
    config = KVTiersConfig(host=HostTierConfig(bytes=2 * B, min_reuse=3))  # gate not applied
    blocks = device()
    tiers, batches = make(config, blocks, clock)
    pulled = [torch.full((B,), 7, dtype=torch.uint8), torch.full((B,), 9, dtype=torch.uint8)]
    assert tiers.admit([201, 202], pulled) == 2
    assert events(batches, tiers) == [("stored", "host", [201]), ("stored", "host", [202])]
    assert tiers.find([201, 202, 203]) == 2
    assert tiers.counters["host"].offload_bytes == 0  # nothing left this engine's device
    assert load(tiers, "req-1", [201, 202], [5, 6]) == 2
    assert torch.equal(blocks[5], pulled[0]) and torch.equal(blocks[6], pulled[1])
    assert tiers.admit([201], [pulled[0]]) == 1  # held already: refreshed, not stored twice
    assert events(batches, tiers) == []
    tiers.check_integrity()
    tiers.close()


def test_admitting_stops_at_a_block_it_cannot_hold(clock: Clock) -> None:
    tiers, _ = make(KVTiersConfig(host=HostTierConfig(bytes=4 * B)), device(), clock)
    good, short = torch.zeros(B, dtype=torch.uint8), torch.zeros(B - 1, dtype=torch.uint8)
    assert tiers.admit([301, 302, 303], [good, short, good]) == 1  # a leading run only
    assert tiers.find([301, 302]) == 1
    tiers.close()
    no_host, _ = make(KVTiersConfig(), device(), clock)
    assert no_host.admit([301], [good]) == 0
    no_host.close()
