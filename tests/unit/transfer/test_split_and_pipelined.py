"""Split pulls (several concurrent streams over disjoint blocks) and pipelined exports (blocks
pulled as the prefill computes them, the prefill's first token learnt from the exporter): bit
exact, freed exactly once as completed, and every failure frees both sides."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from core.config import TransferConfig
from core.kv_handle import ExportDone, TransferFailure, TransferState
from tests.unit.transfer.block_layout import LAYOUT
from transfer import (
    InProcKVHub,
    InProcKVTransport,
    KVExportServer,
    KVImportClient,
    NumpyBlockStore,
    ReleaseCause,
)
from transfer.streams import StreamPlan

pytestmark = pytest.mark.timeout(60)
BLOCK_BYTES = LAYOUT.block_bytes
SPLIT = {"num_streams": 4, "min_stream_bytes": 128 * 1024}  # 8 blocks a stream


def blocks_equal(
    a: NumpyBlockStore, a_ids: list[int], b: NumpyBlockStore, b_ids: list[int]
) -> bool:
    return all(np.array_equal(a.data[i], b.data[j]) for i, j in zip(a_ids, b_ids, strict=True))


def test_a_stream_plan_splits_by_size_and_count() -> None:
    plan = StreamPlan(max_streams=4, min_stream_bytes=4 * BLOCK_BYTES)
    assert plan.split(3, BLOCK_BYTES) == [(0, 3)]  # under two streams' worth: one stream
    assert plan.split(8, BLOCK_BYTES) == [(0, 4), (4, 8)]
    assert plan.split(100, BLOCK_BYTES) == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert plan.split(0, BLOCK_BYTES) == []
    assert plan.min_segment_blocks(BLOCK_BYTES) == 4
    assert StreamPlan.from_config(TransferConfig(num_streams=3)).max_streams == 3
    assert StreamPlan.from_config(TransferConfig()).max_streams >= 1


def test_a_split_pull_is_bit_exact_and_completes_the_export_once(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    num_blocks = 64  # 1 MiB of 16 KiB blocks: four streams of 256 KiB
    source, dest = make_store(num_blocks, seed=11), make_store(num_blocks + 8)
    server = make_server(source, config)
    client = make_client(dest, config.model_copy(update=SPLIT))
    released: list[ReleaseCause] = []
    src_ids = list(range(num_blocks))
    handle = server.export(src_ids, released.append)
    wanted = list(range(0, num_blocks, 2)) + list(range(1, num_blocks, 2))  # any order
    dst_ids = [8 + i for i in range(num_blocks)]
    status = client.pull(handle, dst_ids, wanted).wait(20)
    assert status.state is TransferState.DONE, status
    assert blocks_equal(source, wanted, dest, dst_ids)
    assert waiter(lambda: released == [ReleaseCause.COMPLETED])
    assert server.exporter.num_live_exports() == 0


def test_split_streams_may_not_overlap(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source, dest = make_store(8, seed=2), make_store(8)
    server = make_server(source, config)
    client = make_client(dest, config)
    handle = server.export(list(range(8)))
    first = client.open_stream(handle, [0, 1, 2], keep_export=True)
    chunks = iter(first)
    next(chunks)  # the stream has begun: blocks 0-2 are being pulled
    with pytest.raises(Exception, match="already being pulled"):
        list(client.open_stream(handle, [2, 3], keep_export=True))
    list(chunks)
    list(client.open_stream(handle, [3, 4], keep_export=True))  # disjoint: fine
    assert server.exporter.num_live_exports() == 1  # kept pinned for the importer
    client.release(handle, completed=True)
    assert server.exporter.num_live_exports() == 0


@pytest.mark.parametrize("transport", ["grpc", "inproc"])
def test_a_pipelined_export_is_pulled_as_it_grows(
    transport: str,
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    num_blocks = 48
    source, dest = make_store(num_blocks, seed=7), make_store(num_blocks)
    released: list[ReleaseCause] = []
    split = config.model_copy(update=SPLIT)
    if transport == "grpc":
        server = make_server(source, config)
        exporter, importer = server.exporter, make_client(dest, split)
    else:
        hub = InProcKVHub()
        exporting = InProcKVTransport(source, hub)
        exporter = exporting.exporter
        importer = InProcKVTransport(dest, hub, plan=StreamPlan.from_config(split))
    handle = exporter.open_export(num_blocks, released.append)
    assert handle.pipelined and handle.num_blocks == num_blocks
    wanted = list(range(4, num_blocks))  # blocks 0-3 are a local prefix hit
    task = importer.pull(handle, list(range(4, num_blocks)), wanted)
    order = list(range(num_blocks))
    for start in range(0, num_blocks - 8, 8):  # the prefill's chunks complete one by one
        exporter.add_ready(handle.transfer_id, order[start : start + 8])
    # 36 wanted blocks are ready: two 16-block segments move while the last chunk computes
    assert waiter(lambda: task.status().bytes_done >= 32 * BLOCK_BYTES)
    assert task.state is TransferState.TRANSFERRING
    done = ExportDone(first_token_id=77, prompt_chunk_ends=(128, 256, 384))
    exporter.finish(handle.transfer_id, order[num_blocks - 8 :], done)
    status = task.wait(20)
    assert status.state is TransferState.DONE, status
    assert task.export_done == done
    assert blocks_equal(source, wanted, dest, wanted)
    assert waiter(lambda: released == [ReleaseCause.COMPLETED])
    if transport == "inproc":
        importer.close()
        exporting.close()


def test_a_pipelined_export_answers_await_and_refuses_unready_blocks(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source, dest = make_store(8, seed=1), make_store(8)
    server = make_server(source, config)
    client = make_client(dest, config)
    handle = server.exporter.open_export(4)
    assert client.await_ready(handle, 1, 0.05) == (0, None)
    server.exporter.add_ready(handle.transfer_id, [5, 6])
    assert client.await_ready(handle, 1, 5.0) == (2, None)
    with pytest.raises(Exception, match="not computed yet"):
        list(client.open_stream(handle, [1, 2], keep_export=True))
    server.exporter.finish(handle.transfer_id, [0, 3], ExportDone(9))
    assert client.await_ready(handle, 4, 5.0) == (4, ExportDone(9))
    with pytest.raises(Exception, match="already complete"):
        server.exporter.add_ready(handle.transfer_id, [1])
    client.release(handle)


def test_an_abandoned_pipelined_export_fails_the_pull_and_frees_both_sides(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    source, dest = make_store(16, seed=4), make_store(16)
    server = make_server(source, config)
    client = make_client(dest, config.model_copy(update=SPLIT))
    released: list[ReleaseCause] = []
    handle = server.exporter.open_export(16, released.append)
    task = client.pull(handle, list(range(16)))
    server.exporter.add_ready(handle.transfer_id, list(range(4)))
    server.exporter.release(handle.transfer_id)  # the prefill gave up (aborted, preempted)
    status = task.wait(20)
    assert status.state is TransferState.FAILED
    assert status.reason is TransferFailure.UNKNOWN_TRANSFER
    assert set(status.invalid_block_ids) >= set(range(4, 16))
    assert released == [ReleaseCause.RELEASED]
    assert waiter(lambda: client.num_in_flight() == 0)


def test_cancelling_a_pipelined_pull_stops_waiting_and_releases_the_export(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    source, dest = make_store(8, seed=4), make_store(8)
    server = make_server(source, config)
    client = make_client(dest, config)
    released: list[ReleaseCause] = []
    handle = server.exporter.open_export(8, released.append)
    task = client.pull(handle, list(range(8)))
    assert waiter(lambda: task.state is TransferState.TRANSFERRING)
    task.cancel()
    status = task.wait(10)
    assert status.state is TransferState.FAILED and status.reason is TransferFailure.CANCELLED
    assert waiter(lambda: released == [ReleaseCause.RELEASED])


def test_a_stream_failing_mid_split_pull_cancels_the_others(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    from transfer import FaultInjection

    source, dest = make_store(64, seed=9), make_store(64)
    server = make_server(source, config, faults=FaultInjection(fail_after_chunks=0))
    client = make_client(dest, config.model_copy(update=SPLIT))
    released: list[ReleaseCause] = []
    handle = server.export(list(range(64)), released.append)
    status = client.pull(handle, list(range(64))).wait(20)
    assert status.state is TransferState.FAILED
    assert status.reason is TransferFailure.EXPORTER_ERROR
    assert len(status.invalid_block_ids) == 64
    assert waiter(lambda: released == [ReleaseCause.RELEASED])
    assert waiter(lambda: client.num_in_flight() == 0)
    assert threading.active_count() < 200


def test_a_stalled_pipelined_export_fails_the_pull_after_the_deadline(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    source, dest = make_store(8, seed=4), make_store(8)
    server = make_server(source, config)
    client = make_client(dest, config.model_copy(update={"pull_deadline_s": 0.3}))
    released: list[ReleaseCause] = []
    handle = server.exporter.open_export(8, released.append)
    server.exporter.add_ready(handle.transfer_id, [0, 1])
    status = client.pull(handle, list(range(8))).wait(20)  # the prefill hangs after 2 blocks
    assert status.state is TransferState.FAILED
    assert status.reason is TransferFailure.DEADLINE_EXCEEDED, status
    assert "gained no block" in status.message
    assert waiter(lambda: released == [ReleaseCause.RELEASED])
    assert waiter(lambda: client.num_in_flight() == 0)
