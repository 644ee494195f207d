"""Bit-exact pulls over loopback gRPC: layouts, subsets, many at once, and what gets freed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from core.config import TransferConfig
from core.kv_handle import TransferState
from core.kv_layout import KVLayout
from transfer import (
    GrpcKVTransport,
    KVExportServer,
    KVImportClient,
    NumpyBlockStore,
    ReleaseCause,
    TransferSide,
)
from transfer.proto._generated import kv_transfer_pb2 as pb
from transfer.rpc import KVTransferClientMethods

pytestmark = pytest.mark.timeout(60)

LAYOUTS = [
    # builtin:tiny-llama: 32 KiB blocks, many per chunk.
    pytest.param(KVLayout("tiny-llama", "float32", 16, 4, 2, 32, 0), 80, id="fp32-32KiB"),
    # 1.5 MiB blocks: chunks of 1 MiB straddle block boundaries.
    pytest.param(KVLayout("m", "bfloat16", 16, 24, 8, 128, 0), 5, id="bf16-1.5MiB"),
    pytest.param(KVLayout("m", "float16", 32, 2, 4, 64, 0), 20, id="fp16-64KiB"),
    pytest.param(KVLayout("m", "float32", 8, 1, 1, 16, 0), 3, id="fp32-1KiB"),
]


def special_floats(store: NumpyBlockStore) -> None:
    """Put NaN payloads, signed zeros, infinities and subnormals into block 0."""
    values = np.array(
        [np.nan, -0.0, np.inf, -np.inf, 1e-45, -1e-40, 3.4e38], dtype=np.float32
    ).view(np.uint8)
    store.data[0, : values.size] = values
    store.data[0, values.size : values.size + 4] = [0x01, 0x00, 0xC0, 0x7F]  # NaN, payload 1


@pytest.mark.parametrize(("layout", "num_blocks"), LAYOUTS)
def test_full_pull_is_bit_exact(
    layout: KVLayout,
    num_blocks: int,
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source = make_store(num_blocks, layout, seed=3)
    special_floats(source)
    dest = make_store(num_blocks + 2, layout)
    server, client = make_server(source, config), make_client(dest, config)
    released: list[ReleaseCause] = []
    exported = list(range(num_blocks))[::-1]
    handle = server.export(exported, released.append)
    assert handle.num_blocks == num_blocks and handle.block_bytes == layout.block_bytes
    dst_ids = [i + 2 for i in range(num_blocks)]
    status = client.pull(handle, dst_ids).wait(timeout_s=20)
    assert status.state is TransferState.DONE, status
    assert status.bytes_done == status.bytes_total == num_blocks * layout.block_bytes
    np.testing.assert_array_equal(dest.data[dst_ids], source.data[exported])
    assert not dest.data[:2].any()
    assert released == [ReleaseCause.COMPLETED]
    assert server.exporter.num_live_exports() == 0


def test_subset_in_any_order_lands_in_the_given_blocks(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source, dest = make_store(10, seed=4), make_store(10)
    server, client = make_server(source, config), make_client(dest, config)
    exported = [9, 8, 7, 6, 5]
    handle = server.export(exported)
    client.pull(handle, [0, 3], wanted_indices=[4, 1]).result(timeout_s=10)
    np.testing.assert_array_equal(dest.data[0], source.data[5])
    np.testing.assert_array_equal(dest.data[3], source.data[8])
    assert not dest.data[[1, 2, 4, 5, 6, 7, 8, 9]].any()


def test_pulling_nothing_releases_the_export(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    source, dest = make_store(4, seed=5), make_store(4)
    server, client = make_server(source, config), make_client(dest, config)
    released: list[ReleaseCause] = []
    handle = server.export([0, 1], released.append)
    assert client.pull(handle, [], wanted_indices=[]).wait(5).state is TransferState.DONE
    assert waiter(lambda: released == [ReleaseCause.RELEASED])
    assert not dest.data.any()


def test_sixteen_concurrent_transfers_share_one_channel(
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    config = TransferConfig(
        bind_host="127.0.0.1", chunk_bytes=1 << 20, server_threads=16, import_threads=16
    )
    num_transfers, blocks_each = 16, 80  # 1.25 MiB each: two chunks
    source = make_store(num_transfers * blocks_each, seed=6)
    dest = make_store(num_transfers * blocks_each)
    server, client = make_server(source, config), make_client(dest, config)
    peak, lock, in_flight = [0], threading.Lock(), [0]

    def track(delta: int) -> None:
        with lock:
            in_flight[0] += delta
            peak[0] = max(peak[0], in_flight[0])

    tasks = []
    for t in range(num_transfers):
        ids = list(range(t * blocks_each, (t + 1) * blocks_each))
        handle = server.export(ids)
        track(+1)
        task = client.pull(handle, ids[::-1])
        task.add_done_callback(lambda _task: track(-1))
        tasks.append((task, ids))
    for task, ids in tasks:
        task.result(timeout_s=30)
        np.testing.assert_array_equal(dest.data[ids[::-1]], source.data[ids])
    assert client.num_channels() == 1
    assert peak[0] > 1
    snapshot = server.metrics.snapshot()
    assert snapshot.transfers_total[(TransferSide.EXPORT, "ok")] == num_transfers
    assert snapshot.bytes_total[TransferSide.EXPORT] == source.data.nbytes
    assert snapshot.in_flight[TransferSide.EXPORT] == 0


def test_metrics_count_bytes_and_durations_on_the_import_side(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source, dest = make_store(8, seed=7), make_store(8)
    server, client = make_server(source, config), make_client(dest, config)
    for _ in range(3):
        client.pull(server.export(range(8)), range(8)).result(timeout_s=10)
    snapshot = client.metrics.snapshot()
    assert snapshot.bytes_total[TransferSide.IMPORT] == 3 * source.data.nbytes
    assert sum(snapshot.duration_bucket_counts[TransferSide.IMPORT]) == 3
    assert snapshot.duration_sum_s[TransferSide.IMPORT] > 0
    assert snapshot.failures(TransferSide.IMPORT) == {}


def test_grpc_transport_and_health_service(
    config: TransferConfig, make_store: Callable[..., NumpyBlockStore]
) -> None:
    prefill_store = make_store(6, seed=8)
    prefill = GrpcKVTransport(prefill_store, config, serve=True)
    decode_store = make_store(6)
    decode = GrpcKVTransport(decode_store, config, serve=False)
    try:
        assert prefill.address is not None and prefill.address.startswith("127.0.0.1:")
        assert decode.address is None
        handle = prefill.export([1, 2, 3])
        assert decode.heartbeat(handle) >= handle.lease_deadline_unix_ms
        decode.pull(handle, [3, 4, 5]).result(timeout_s=10)
        np.testing.assert_array_equal(decode_store.data[3:6], prefill_store.data[1:4])
        with grpc.insecure_channel(prefill.address) as channel:  # no token: health is exempt
            check = health_pb2_grpc.HealthStub(channel).Check
            response = check(health_pb2.HealthCheckRequest(service="pdserve.kv.v1.KVTransfer"))
            assert response.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        decode.close()
        prefill.close()


def new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    return set(threading.enumerate()) - before


def test_connect_opens_the_channel_that_the_first_pull_then_reuses(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    source, dest = make_store(4, seed=10), make_store(4)
    server, client = make_server(source, config), make_client(dest, config)
    client.connect(server.address)
    client.connect(server.address)  # idempotent
    assert client.num_channels() == 1
    channel, _ = client._entry(server.address)
    before = set(threading.enumerate())
    states: list[grpc.ChannelConnectivity] = []
    channel.subscribe(states.append, try_to_connect=False)  # observe only: never dials itself
    try:
        assert waiter(lambda: grpc.ChannelConnectivity.READY in states)
    finally:
        channel.unsubscribe(states.append)
    # grpc's state watcher thread polls every 0.2 s; let it see the unsubscribe and end.
    assert waiter(lambda: all(t.name.startswith("pdserve-kv") for t in new_threads(before)))
    client.pull(server.export(range(4)), range(4)).result(timeout_s=10)
    np.testing.assert_array_equal(dest.data, source.data)
    assert client.num_channels() == 1


def test_connecting_to_a_dead_peer_fails_nothing_and_closes_cleanly(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    waiter: Callable[..., bool],
) -> None:
    with socket.socket() as probe:  # a port with no listener
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"

    before = set(threading.enumerate())
    client = KVImportClient(make_store(1), config)
    client.connect(dead)
    started_s = time.monotonic()
    client.close()
    assert time.monotonic() - started_s < 5.0
    assert waiter(lambda: not new_threads(before))  # nothing left running
    client.connect(dead)  # after close: a no-op, not an error
    assert client.num_channels() == 0


def test_a_prompt_sized_pull_streams_in_1_mib_chunks(
    make_store: Callable[..., NumpyBlockStore], make_server: Callable[..., KVExportServer]
) -> None:
    config = TransferConfig(bind_host="127.0.0.1", chunk_bytes=2 << 20)  # 2 MiB configured
    source = make_store(512, seed=11)  # 8 MiB of 16 KiB blocks
    server = make_server(source, config)
    handle = server.export(range(512))
    request = pb.PullRequest(
        transfer_id=handle.transfer_id,
        layout_fingerprint=handle.layout_fingerprint,
        exporter_epoch=handle.exporter_epoch,
    )
    with grpc.insecure_channel(server.address) as channel:
        chunks = [pb.Chunk.FromString(m) for m in KVTransferClientMethods(channel).pull(request)]
    assert [len(c.payload) for c in chunks] == [1 << 20] * 8
    assert b"".join(c.payload for c in chunks) == source.data.tobytes()
