"""Staging KV between the device tensor and its host mirror: runs, fences, and the CPU path."""

from __future__ import annotations

import threading

import pytest
import torch

from core.errors import KVCacheError
from core.kv_layout import KVLayout
from engine.kv.staging import DONE, BlockCopier, StagingTracker, contiguous_runs
from engine.kv.storage import KVStorage

LAYOUT = KVLayout(
    "m", "float32", block_size=4, num_layers=2, num_kv_heads=2, head_dim=8, hash_seed=0
)


class FakeFence:
    """A fence whose completion the test controls."""

    def __init__(self, done: bool = False) -> None:
        self.finished = done
        self.host_waits = 0
        self.compute_waits = 0
        self.on_wait_host = lambda: None

    def done(self) -> bool:
        return self.finished

    def wait_host(self) -> None:
        self.host_waits += 1
        self.on_wait_host()
        self.finished = True

    def wait_compute(self) -> None:
        self.compute_waits += 1


def test_contiguous_runs() -> None:
    assert contiguous_runs([5, 1, 2, 3, 9, 10]) == [(1, 4), (5, 6), (9, 11)]
    assert contiguous_runs([4, 4, 3]) == [(3, 5)]
    assert contiguous_runs([7]) == [(7, 8)]
    assert contiguous_runs([]) == []


def test_readers_wait_for_the_latest_export_of_their_block() -> None:
    tracker = StagingTracker()
    first, second = FakeFence(), FakeFence()
    tracker.exported([1, 2], first)
    tracker.exported([2], second)
    tracker.wait_host(1)
    assert (first.host_waits, second.host_waits) == (1, 0)
    assert tracker.num_pending_exports == 1  # block 2 still pending
    tracker.wait_host(2)
    assert (first.host_waits, second.host_waits) == (1, 1)
    assert tracker.num_pending_exports == 0
    tracker.wait_host(2)  # nothing pending: no wait
    tracker.wait_host(99)
    assert second.host_waits == 1


def test_an_export_made_while_a_reader_waits_stays_pending() -> None:
    tracker = StagingTracker()
    old, new = FakeFence(), FakeFence()
    old.on_wait_host = lambda: tracker.exported([3], new)
    tracker.exported([3], old)
    tracker.wait_host(3)
    assert tracker.num_pending_exports == 1
    tracker.wait_host(3)
    assert new.host_waits == 1


def test_compute_waits_only_for_imports_still_in_flight() -> None:
    tracker = StagingTracker()
    finished, in_flight = FakeFence(done=True), FakeFence()
    tracker.imported(finished)
    tracker.imported(in_flight)
    assert tracker.fence_uploads() == 1
    assert (finished.compute_waits, in_flight.compute_waits) == (0, 1)
    assert tracker.fence_uploads() == 0  # each import is fenced once
    assert in_flight.host_waits == 0  # the host never blocks on an import


def test_tracker_is_safe_across_threads() -> None:
    tracker = StagingTracker()
    fences = [FakeFence(done=True) for _ in range(200)]

    def export() -> None:
        for i, fence in enumerate(fences):
            tracker.exported([i % 16], fence)

    def read() -> None:
        for i in range(200):
            tracker.wait_host(i % 16)

    threads = [threading.Thread(target=export), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    for block_id in range(16):
        tracker.wait_host(block_id)
    assert tracker.num_pending_exports == 0


def staged_storage() -> KVStorage:
    storage = KVStorage(LAYOUT, 8, torch.device("cpu"), host_staging=True)
    assert storage.staged
    return storage


def test_cpu_mirror_copies_exactly_the_staged_blocks() -> None:
    storage = staged_storage()
    storage.kv.copy_(torch.randn(storage.kv.shape))
    storage.stage_to_host([6, 2, 3])
    for block_id in range(8):
        copied = torch.equal(storage.host[block_id], storage.kv[block_id])
        assert copied is (block_id in (2, 3, 6))
        view = storage.block_view(block_id)
        assert bytes(view) == storage.host[block_id].numpy().tobytes()
    assert storage.staging.num_pending_exports == 0  # every reader waited (here: done fences)

    storage.host.copy_(torch.randn(storage.host.shape))
    before = storage.kv.clone()
    storage.stage_to_device([5, 1])
    storage.fence_uploads()
    for block_id in range(8):
        expected = storage.host[block_id] if block_id in (1, 5) else before[block_id]
        assert torch.equal(storage.kv[block_id], expected)


def test_staging_refuses_unknown_blocks() -> None:
    storage = staged_storage()
    with pytest.raises(KVCacheError, match=r"\[8\]"):
        storage.stage_to_host([1, 8])
    with pytest.raises(KVCacheError, match=r"\[-1\]"):
        storage.stage_to_device([-1])


def test_unstaged_storage_is_its_own_mirror() -> None:
    storage = KVStorage(LAYOUT, 4, torch.device("cpu"))
    assert not storage.staged and storage.host is storage.kv
    storage.stage_to_host([1, 2])
    storage.stage_to_device([3])
    assert storage.staging.num_pending_exports == 0
    assert storage.staging.fence_uploads() == 0


def test_copier_on_cpu_finishes_before_returning() -> None:
    kv, host = torch.randn(4, 3), torch.zeros(4, 3)
    copier = BlockCopier(kv, host)
    assert copier.stream is None
    assert copier.to_host([0, 1, 3]) is DONE
    assert torch.equal(host[[0, 1, 3]], kv[[0, 1, 3]]) and not host[2].any()
    with pytest.raises(ValueError, match="differ"):
        BlockCopier(kv, torch.zeros(5, 3))
