"""KV event messages cross processes as JSON; the publisher numbers batches without gaps."""

from __future__ import annotations

import json

import pytest

from core.codec import from_plain, to_plain
from core.errors import MessageError
from core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from engine.kv.event_publisher import KVEventPublisher


def test_batch_round_trips_through_json() -> None:
    batch = KVEventBatch(
        replica_seq=7,
        timestamp_s=12.5,
        events=[
            BlockStored(
                block_hashes=[2**63 + 5, 9], parent_hash=None, token_ids=[1, 2, 3, 4], block_size=2
            ),
            BlockStored(block_hashes=[10], parent_hash=9, token_ids=[5, 6], block_size=2),
            BlockRemoved(block_hashes=[9, 10]),
            AllBlocksCleared(),
        ],
    )
    wire = json.dumps(to_plain(batch))
    assert from_plain(KVEventBatch, json.loads(wire)) == batch
    assert batch.events[0].num_tokens == 4  # type: ignore[union-attr]


def test_unknown_event_kind_is_rejected() -> None:
    with pytest.raises(MessageError, match="matches no single member"):
        from_plain(KVEventBatch, {"replica_seq": 0, "events": [{"moved": [1]}]})


def test_publisher_numbers_batches_and_skips_empty_flushes() -> None:
    batches: list[KVEventBatch] = []
    publisher = KVEventPublisher(batches.append)
    assert publisher.flush() is None
    publisher.record(BlockRemoved(block_hashes=[1]))
    publisher.record(AllBlocksCleared())
    first = publisher.flush()
    assert publisher.flush() is None
    publisher.record(BlockRemoved(block_hashes=[2]))
    publisher.flush()
    assert [b.replica_seq for b in batches] == [0, 1]
    assert first is batches[0]
    assert batches[0].events == [BlockRemoved(block_hashes=[1]), AllBlocksCleared()]
    assert publisher.next_seq == 2


def test_publisher_without_callback_buffers_nothing() -> None:
    publisher = KVEventPublisher()
    publisher.record(AllBlocksCleared())
    assert not publisher.enabled
    assert publisher.flush() is None
    assert publisher.next_seq == 0
