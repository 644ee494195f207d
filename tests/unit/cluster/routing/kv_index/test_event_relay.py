"""Worker side: the real engine KV cache's events reach the index, which then predicts exactly
the prefix hits the engine will have; lost batches and failed sends end in a resync."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from cluster.routing.kv_index.compaction import TierSnapshot
from cluster.routing.kv_index.event_relay import KVEventPump, KVEventRelay
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.replication import KVIndexServer
from core.hashing import hash_prompt_blocks
from core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from core.kv_index_messages import CompactBatch, PublishReply
from core.sampling import SamplingParams
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.kv_cache_manager import KVCacheManager
from engine.request import Request
from tests.waiting import wait_until

BLOCK_SIZE = 4
SEED = 77


class Engine:
    """A real KV cache manager whose events go through a relay (as in a worker)."""

    def __init__(self, relay: Callable[[KVEventBatch], None], num_blocks: int = 9) -> None:
        self.publisher = KVEventPublisher(relay)
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE, hash_seed=SEED, publisher=self.publisher)
        self._next_id = 0

    def run_prompt(self, prompt: list[int], *, keep: bool = False) -> int:
        """Prefill ``prompt`` reusing cached blocks; returns the cached blocks it hit."""
        self._next_id += 1
        request = Request(f"r{self._next_id}", prompt, SamplingParams(max_tokens=4))
        hit = self.kv.get_computed_blocks(request, request.num_tokens - 1)
        assert self.kv.allocate_slots(request, request.num_tokens - hit.num_tokens, hit)
        request.num_computed_tokens = request.num_tokens
        self.kv.cache_full_blocks(request)
        if not keep:
            self.kv.free(request.request_id)
        self.publisher.flush()
        return len(hit.block_ids)

    def predicted_hit(self, prompt: list[int]) -> int:
        probe = Request("probe", prompt, SamplingParams(max_tokens=4))
        return len(self.kv.get_computed_blocks(probe, len(prompt) - 1).block_ids)


def prompt_of(prefix: int, num_blocks: int, tail: int = 1) -> list[int]:
    return [prefix * 1000 + i for i in range(num_blocks * BLOCK_SIZE)] + [9] * tail


def test_index_predicts_the_engines_prefix_hits_through_evictions() -> None:
    server = KVIndexServer()
    relay = KVEventRelay()
    engine = Engine(relay)  # 8 usable blocks: the prompts below force LRU evictions
    pump = KVEventPump(relay, server, "w0", "prefill")
    assert pump.pump_once()  # registration snapshot
    prompts = [prompt_of(1, 3), prompt_of(2, 2), prompt_of(1, 4), prompt_of(3, 3), prompt_of(1, 2)]
    prompts.append(prompt_of(2, 2))  # cached once, evicted since
    hits = []
    for prompt in prompts:
        hashes = hash_prompt_blocks(prompt, BLOCK_SIZE, seed=SEED)
        predicted = server.index.match("prefill", hashes).get("w0", 0)
        assert predicted == engine.predicted_hit(prompt)
        assert engine.run_prompt(prompt) == predicted
        assert pump.pump_once()
        hits.append(predicted)
    assert hits == [0, 0, 3, 0, 2, 0]  # prefix 1 hits twice; prefix 2 was evicted in between
    assert server.index.cached_hashes("w0") == {
        h
        for p in prompts
        for h in hash_prompt_blocks(p, BLOCK_SIZE, seed=SEED)
        if engine.kv.pool.lookup(h) is not None
    }
    assert not server.index.is_degraded("w0")


class FlakySink:
    """Wraps a server; fails the next ``failures`` calls."""

    def __init__(self, server: KVIndexServer) -> None:
        self.server = server
        self.failures = 0

    def _maybe_fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("index unreachable")

    def publish(self, replica_id: str, batches: Sequence[CompactBatch]) -> PublishReply:
        self._maybe_fail()
        return self.server.publish(replica_id, batches)

    def resync(
        self,
        replica_id: str,
        pool: str,
        hashes: Sequence[int],
        seq: int,
        tiers: TierSnapshot | None = None,
    ) -> None:
        self._maybe_fail()
        self.server.resync(replica_id, pool, hashes, seq, tiers)

    def remove_replica(self, replica_id: str) -> bool:
        self._maybe_fail()
        return self.server.remove_replica(replica_id)


def test_a_failed_send_is_repaired_by_a_snapshot() -> None:
    server = KVIndexServer()
    sink = FlakySink(server)
    relay = KVEventRelay()
    engine = Engine(relay)
    pump = KVEventPump(relay, sink, "w0", "decode")
    assert pump.pump_once()
    engine.run_prompt(prompt_of(1, 2))
    sink.failures = 1
    assert not pump.pump_once()  # the batch is lost with the call
    engine.run_prompt(prompt_of(2, 1))
    assert pump.pump_once()  # sends a snapshot instead of the next batch
    hashes = hash_prompt_blocks(prompt_of(1, 2), BLOCK_SIZE, seed=SEED)
    assert server.index.match("decode", hashes) == {"w0": 2}
    assert server.index.last_seq("w0") == engine.publisher.next_seq - 1


def test_a_gap_seen_by_the_index_triggers_a_resync() -> None:
    server = KVIndexServer()
    relay = KVEventRelay()
    pump = KVEventPump(relay, server, "w0", "prefill")
    pump.pump_once()
    relay(KVEventBatch(0, [BlockStored([11], None, [0] * 4, 4)]))
    relay.take()  # batch 0 vanishes between relay and index
    relay(KVEventBatch(1, [BlockStored([12], 11, [0] * 4, 4)]))
    assert pump.pump_once()
    assert server.index.is_degraded("w0")
    assert pump.pump_once()  # the reply asked for a snapshot; this sends it
    assert server.index.match("prefill", [11, 12]) == {"w0": 2}


def test_too_many_pending_batches_become_one_snapshot() -> None:
    relay = KVEventRelay(max_pending_batches=2)
    relay.take()  # the registration snapshot
    for seq in range(3):
        relay(KVEventBatch(seq, [BlockStored([seq], None, [0] * 4, 4)]))
    outgoing = relay.take()
    assert outgoing.batches == []
    assert sorted(outgoing.snapshot_hashes or []) == [0, 1, 2]
    assert outgoing.snapshot_seq == 3


@pytest.mark.timeout(20)
def test_pump_thread_delivers_events_and_deregisters_on_close() -> None:
    server = KVIndexServer()
    lock = threading.Lock()

    class LockedSink:
        def publish(self, replica_id: str, batches: Sequence[CompactBatch]) -> PublishReply:
            with lock:
                return server.publish(replica_id, batches)

        def resync(
            self,
            replica_id: str,
            pool: str,
            hashes: Sequence[int],
            seq: int,
            tiers: TierSnapshot | None = None,
        ) -> None:
            with lock:
                server.resync(replica_id, pool, hashes, seq, tiers)

        def remove_replica(self, replica_id: str) -> bool:
            with lock:
                return server.remove_replica(replica_id)

    relay = KVEventRelay()
    pump = KVEventPump(relay, LockedSink(), "w0", "prefill", flush_interval_s=0.001)
    pump.start()
    relay(KVEventBatch(0, [BlockStored([5, 6], None, [0] * 8, 4)]))

    def indexed() -> bool:
        with lock:
            return server.index.match("prefill", [5, 6]) == {"w0": 2}

    wait_until(indexed)
    pump.close()
    assert server.index.replica_ids() == []


def test_snapshots_carry_the_lower_tiers() -> None:
    server = KVIndexServer()
    relay = KVEventRelay()
    pump = KVEventPump(relay, server, "w0", "decode")
    pump.pump_once()
    relay(KVEventBatch(0, [BlockStored([11, 12], None, [0] * 8, 4)]))
    relay(KVEventBatch(1, [BlockStored([12], 11, [0] * 4, 4, medium="host")]))
    relay(KVEventBatch(2, [BlockRemoved([12])]))
    relay.request_snapshot()
    outgoing = relay.take()
    assert outgoing.snapshot_hashes == [11]
    assert outgoing.snapshot_tiers == {"host": [12]}
    relay.request_snapshot()
    assert pump.pump_once()
    assert server.index.match_tiers("decode", [11, 12]) == {"w0": TierHit(1, 1, 0)}
