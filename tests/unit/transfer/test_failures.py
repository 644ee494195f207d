"""Every failure ends a transfer FAILED(reason) in bounded time and leaks nothing on either side."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest

from core.codec import from_plain
from core.config import TransferConfig
from core.errors import TransferError
from core.kv_handle import KVHandle, TransferFailure, TransferState, TransferStatus
from core.kv_layout import KVLayout
from transfer import (
    FaultInjection,
    KVExportServer,
    KVImportClient,
    NumpyBlockStore,
    ReleaseCause,
    TransferSide,
    TransferTask,
)

pytestmark = pytest.mark.timeout(60)

NUM_BLOCKS = 256  # 4 MiB of 16 KiB blocks: four 1 MiB chunks of 64 blocks
BLOCKS_PER_CHUNK = 64

MakeStore = Callable[..., NumpyBlockStore]
MakeServer = Callable[..., KVExportServer]
MakeClient = Callable[..., KVImportClient]
Waiter = Callable[..., bool]


def failed(task: TransferTask, timeout_s: float = 10.0) -> TransferStatus:
    status = task.wait(timeout_s)
    assert status.state is TransferState.FAILED, status
    return status


def pair(
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
    faults: FaultInjection | None = None,
) -> tuple[KVExportServer, KVImportClient, NumpyBlockStore]:
    server = make_server(make_store(NUM_BLOCKS, seed=11), config, faults)
    dest = make_store(NUM_BLOCKS)
    return server, make_client(dest, config), dest


def test_exporter_stopped_mid_stream(
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
    waiter: Waiter,
) -> None:
    faults = FaultInjection(delay_per_chunk_s=0.2)
    server, client, _ = pair(config, make_store, make_server, make_client, faults)
    released: list[ReleaseCause] = []
    task = client.pull(server.export(range(NUM_BLOCKS), released.append), range(NUM_BLOCKS))
    assert waiter(lambda: task.status().bytes_done > 0)
    started_s = time.monotonic()
    server.stop()
    status = failed(task)
    assert time.monotonic() - started_s < 5.0
    assert status.reason == TransferFailure.EXPORTER_UNAVAILABLE
    done_blocks = status.bytes_done // make_store(1).layout.block_bytes
    assert 0 < done_blocks < NUM_BLOCKS
    assert status.invalid_block_ids == tuple(range(done_blocks, NUM_BLOCKS))
    assert released == [ReleaseCause.SHUTDOWN]
    assert waiter(lambda: client.num_in_flight() == 0)


EXPORTER_SCRIPT = """
import json, sys
from core.codec import to_plain
from core.config import TransferConfig
from core.kv_layout import KVLayout
from transfer import FaultInjection, KVExportServer, NumpyBlockStore
store = NumpyBlockStore(KVLayout("test-model", "float32", 16, 2, 2, 32, 0), 256)
config = TransferConfig(bind_host="127.0.0.1", chunk_bytes=1 << 20, insecure_test_token=sys.argv[1])
server = KVExportServer(store, config, faults=FaultInjection(delay_per_chunk_s=0.3))
print(json.dumps(to_plain(server.export(list(range(256))))), flush=True)
sys.stdin.read()
"""


def test_exporter_process_killed_mid_stream(
    config: TransferConfig, make_store: MakeStore, make_client: MakeClient, waiter: Waiter
) -> None:
    import json
    import subprocess
    import sys

    assert config.insecure_test_token is not None
    child = subprocess.Popen(
        [sys.executable, "-c", EXPORTER_SCRIPT, config.insecure_test_token],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        handle = from_plain(KVHandle, json.loads(child.stdout.readline()))
        client = make_client(make_store(NUM_BLOCKS), config)
        task = client.pull(handle, range(NUM_BLOCKS))
        assert waiter(lambda: task.status().bytes_done > 0, 20.0)
        child.kill()
        status = failed(task, timeout_s=5.0)
        assert status.reason == TransferFailure.EXPORTER_UNAVAILABLE
        assert status.invalid_block_ids  # the tail never arrived
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdin is not None:
            child.stdin.close()
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.parametrize(
    ("faults", "reason"),
    [
        (FaultInjection(corrupt_chunk_seq=1), TransferFailure.CORRUPT_CHUNK),
        (FaultInjection(fail_after_chunks=1), TransferFailure.EXPORTER_ERROR),
    ],
)
def test_bad_stream_fails_keeps_good_blocks_and_releases_the_export(
    faults: FaultInjection,
    reason: TransferFailure,
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
    waiter: Waiter,
) -> None:
    server, client, dest = pair(config, make_store, make_server, make_client, faults)
    source = server.exporter.store
    assert isinstance(source, NumpyBlockStore)
    released: list[ReleaseCause] = []
    dst_ids = list(range(NUM_BLOCKS))
    status = failed(client.pull(server.export(range(NUM_BLOCKS), released.append), dst_ids))
    assert status.reason == reason
    # Only chunk 0 arrived intact; nothing of chunk 1 was written.
    assert status.invalid_block_ids == tuple(dst_ids[BLOCKS_PER_CHUNK:])
    assert (dest.data[:BLOCKS_PER_CHUNK] == source.data[:BLOCKS_PER_CHUNK]).all()
    assert not dest.data[BLOCKS_PER_CHUNK:].any()
    # Freed once: by the importer's Release, or by the exporter if it had sent every chunk.
    assert waiter(lambda: len(released) == 1)
    assert released[0] in (ReleaseCause.RELEASED, ReleaseCause.COMPLETED)
    assert server.exporter.num_live_exports() == 0
    assert client.metrics.snapshot().failures(TransferSide.IMPORT) == {str(reason): 1}


def test_deadline_ends_a_stalled_pull(
    make_store: MakeStore, make_server: MakeServer, make_client: MakeClient, waiter: Waiter
) -> None:
    config = TransferConfig(bind_host="127.0.0.1", pull_deadline_s=0.3, rpc_deadline_s=1.0)
    faults = FaultInjection(delay_per_chunk_s=30.0)
    server, client, _ = pair(config, make_store, make_server, make_client, faults)
    released: list[ReleaseCause] = []
    started_s = time.monotonic()
    status = failed(client.pull(server.export(range(4), released.append), range(4)))
    assert status.reason == TransferFailure.DEADLINE_EXCEEDED
    assert time.monotonic() - started_s < 5.0
    assert status.invalid_block_ids == (0, 1, 2, 3)
    assert waiter(lambda: released == [ReleaseCause.RELEASED])


def test_restarted_peer_at_the_same_address_is_detected(
    config: TransferConfig, make_store: MakeStore, make_server: MakeServer, make_client: MakeClient
) -> None:
    first = make_server(make_store(8, seed=1), config)
    client = make_client(make_store(8), config)
    client.pull(first.export(range(2)), range(2)).result(timeout_s=10)  # channel is connected
    handle = first.export(range(8))
    first.stop()
    port = int(handle.address.rsplit(":", 1)[1])
    second = make_server(make_store(8, seed=2), config.model_copy(update={"port": port}))
    assert second.address == handle.address
    status = failed(client.pull(handle, range(8)))
    assert status.reason == TransferFailure.PEER_RESTARTED
    forged = dataclasses.replace(handle, exporter_epoch=second.exporter.epoch)
    assert failed(client.pull(forged, range(8))).reason == TransferFailure.UNKNOWN_TRANSFER
    assert client.num_channels() == 1


@pytest.mark.parametrize(
    "importer_layout",
    [
        KVLayout("test-model", "float32", 16, 2, 2, 64, 0),  # different size
        KVLayout("other-model", "float32", 16, 2, 2, 32, 0),  # same size, different model
    ],
)
def test_layout_mismatch_is_refused_before_any_byte_moves(
    importer_layout: KVLayout,
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
    waiter: Waiter,
) -> None:
    server = make_server(make_store(4, seed=3), config)
    dest = make_store(4, importer_layout)
    client = make_client(dest, config)
    released: list[ReleaseCause] = []
    status = failed(client.pull(server.export(range(4), released.append), range(4)))
    assert status.reason == TransferFailure.LAYOUT_MISMATCH
    assert status.bytes_done == 0 and not dest.data.any()
    assert waiter(lambda: released == [ReleaseCause.RELEASED])


def test_lease_expiry_before_the_pull(
    make_store: MakeStore, make_server: MakeServer, make_client: MakeClient, waiter: Waiter
) -> None:
    config = TransferConfig(bind_host="127.0.0.1", lease_s=0.2)
    server, client, _ = pair(config, make_store, make_server, make_client)
    released: list[ReleaseCause] = []
    handle = server.export(range(4), released.append)
    assert waiter(lambda: released == [ReleaseCause.EXPIRED])
    assert failed(client.pull(handle, range(4))).reason == TransferFailure.LEASE_EXPIRED
    with pytest.raises(TransferError) as info:
        client.heartbeat(handle)
    assert info.value.reason == TransferFailure.LEASE_EXPIRED
    assert released == [ReleaseCause.EXPIRED]
    assert server.metrics.snapshot().lease_releases == {ReleaseCause.EXPIRED: 1}


def test_heartbeats_keep_an_export_alive_past_its_first_deadline(
    make_store: MakeStore, make_server: MakeServer, make_client: MakeClient, waiter: Waiter
) -> None:
    config = TransferConfig(bind_host="127.0.0.1", lease_s=1.0)
    server, client, _ = pair(config, make_store, make_server, make_client)
    released: list[ReleaseCause] = []
    handle = server.export(range(4), released.append)
    first_deadline_ms = handle.lease_deadline_unix_ms
    assert waiter(lambda: time.time() * 1000 > first_deadline_ms - 400)
    new_deadline_ms = client.heartbeat(handle)
    assert new_deadline_ms > first_deadline_ms + 300
    assert waiter(lambda: time.time() * 1000 > first_deadline_ms + 150)
    assert released == [] and server.exporter.num_live_exports() == 1
    client.pull(handle, range(4)).result(timeout_s=10)
    assert released == [ReleaseCause.COMPLETED]


def test_a_dropped_release_is_reclaimed_by_the_lease(
    make_store: MakeStore, make_server: MakeServer, make_client: MakeClient, waiter: Waiter
) -> None:
    config = TransferConfig(bind_host="127.0.0.1", lease_s=0.3)
    server, client, _ = pair(config, make_store, make_server, make_client)
    server.set_faults(FaultInjection(drop_release=True))
    released: list[ReleaseCause] = []
    handle = server.export(range(4), released.append)
    client.release(handle)
    assert server.exporter.num_live_exports() == 1
    assert waiter(lambda: released == [ReleaseCause.EXPIRED])


def test_cancel_stops_the_pull_and_releases_the_export(
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
    waiter: Waiter,
) -> None:
    faults = FaultInjection(delay_per_chunk_s=0.2)
    server, client, _ = pair(config, make_store, make_server, make_client, faults)
    released: list[ReleaseCause] = []
    task = client.pull(server.export(range(NUM_BLOCKS), released.append), range(NUM_BLOCKS))
    assert waiter(lambda: task.state is TransferState.TRANSFERRING)
    assert task.cancel()
    status = failed(task, timeout_s=5.0)
    assert status.reason == TransferFailure.CANCELLED
    assert not task.cancel()
    assert waiter(lambda: released == [ReleaseCause.RELEASED])
    with pytest.raises(TransferError) as info:
        task.result()
    assert info.value.reason == TransferFailure.CANCELLED


def test_closing_the_client_cancels_queued_and_running_pulls(
    make_store: MakeStore, make_server: MakeServer, make_client: MakeClient, waiter: Waiter
) -> None:
    config = TransferConfig(bind_host="127.0.0.1", import_threads=1)
    server, client, _ = pair(config, make_store, make_server, make_client)
    server.set_faults(FaultInjection(delay_per_chunk_s=0.2))
    running = client.pull(server.export(range(100)), range(100))
    queued = client.pull(server.export(range(100, 200)), range(100, 200))
    assert waiter(lambda: running.state is TransferState.TRANSFERRING)
    client.close()
    assert failed(running).reason == TransferFailure.CANCELLED
    assert failed(queued).reason == TransferFailure.CANCELLED
    assert queued.status().invalid_block_ids == tuple(range(100, 200))
    assert waiter(lambda: server.exporter.num_live_exports() == 0)


@pytest.mark.parametrize(
    ("dst", "wanted"),
    [
        ([0, 1], [0]),  # lengths differ
        ([0, NUM_BLOCKS], None),  # destination out of range
        ([0, 0], None),  # destination repeated
        ([0], [5]),  # wanted index out of range of the export
        ([0, 1], [1, 1]),  # wanted index repeated
    ],
)
def test_impossible_arguments_raise_at_once(
    dst: list[int],
    wanted: list[int] | None,
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
) -> None:
    server, client, _ = pair(config, make_store, make_server, make_client)
    handle = server.export([7, 8])
    with pytest.raises(TransferError) as info:
        client.pull(handle, dst, wanted)
    assert info.value.reason == TransferFailure.INVALID_REQUEST
    assert server.exporter.num_live_exports() == 1
    assert client.num_in_flight() == 0


def test_a_duplicate_pull_fails_without_disturbing_the_first(
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
    waiter: Waiter,
) -> None:
    server, client, _ = pair(config, make_store, make_server, make_client)
    server.set_faults(FaultInjection(delay_per_chunk_s=0.1))
    handle = server.export(range(128))
    first = client.pull(handle, range(128))
    assert waiter(lambda: first.state is TransferState.TRANSFERRING)
    assert waiter(lambda: server.metrics.snapshot().in_flight.get(TransferSide.EXPORT) == 1)
    second = client.pull(handle, range(128, 256))
    assert failed(second).reason == TransferFailure.ALREADY_PULLING
    first.result(timeout_s=10)
