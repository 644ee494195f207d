"""The same-node path: an importer on the exporter's node copies blocks straight out of the
exporter's shared-memory KV, with the gRPC stream carrying only locations and checksums. Bit
exact, verified, released as completed; refused for a layout mismatch; and every reason to take
gRPC instead (off, no region, another node, a region that is gone) falls back and is counted."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from core.config import TransferConfig
from core.kv_handle import ExportDone, TransferFailure, TransferState
from core.kv_layout import KVLayout
from core.shared_memory import SHM_DIR
from tests.unit.transfer.block_layout import LAYOUT
from tests.waiting import wait_until
from transfer import (
    FaultInjection,
    InProcKVHub,
    InProcKVTransport,
    KVExportServer,
    KVImportClient,
    NumpyBlockStore,
    ReleaseCause,
)
from transfer.same_node import local_node_id
from transfer.transfer_metrics import TransferSide

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def shared_store() -> Iterator[Callable[..., NumpyBlockStore]]:
    """``shared_store(num_blocks, seed)``: a store in shared memory, unlinked at teardown."""
    stores: list[NumpyBlockStore] = []

    def make(num_blocks: int, seed: int, layout: KVLayout = LAYOUT) -> NumpyBlockStore:
        store = NumpyBlockStore(layout, num_blocks, shared=True)
        store.fill_random(seed)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def paths(client: KVImportClient) -> tuple[dict[str, int], dict[str, int]]:
    stats = client.metrics.snapshot()
    return dict(stats.pulls_by_path or {}), dict(stats.same_node_fallbacks or {})


def test_a_same_node_pull_is_bit_exact_and_completes_the_export(
    config: TransferConfig,
    shared_store: Callable[..., NumpyBlockStore],
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    source, dest = shared_store(40, seed=3), make_store(48)
    server, client = make_server(source, config), make_client(dest, config)
    released: list[ReleaseCause] = []
    handle = server.export(list(range(5, 37)), released.append)
    assert handle.shared_region == source.shared_region and handle.node_id == local_node_id()
    wanted = list(range(2, 32))
    dst = list(range(10, 40))
    status = client.pull(handle, dst, wanted).wait(20)
    assert status.state is TransferState.DONE, status
    pairs = zip(wanted, dst, strict=True)
    assert all(np.array_equal(source.data[5 + w], dest.data[d]) for w, d in pairs)
    assert paths(client) == ({"same_node": 1}, {})
    assert server.metrics.snapshot().bytes_total["export"] == len(wanted) * LAYOUT.block_bytes
    assert waiter(lambda: released == [ReleaseCause.COMPLETED])


def test_a_pipelined_export_takes_the_same_node_path_too(
    config: TransferConfig,
    shared_store: Callable[..., NumpyBlockStore],
    make_store: Callable[..., NumpyBlockStore],
) -> None:
    source, dest = shared_store(16, seed=8), make_store(16)
    hub = InProcKVHub()
    exporting = InProcKVTransport(source, hub)
    importing = InProcKVTransport(dest, hub)
    try:
        handle = exporting.open_export(16)
        task = importing.pull(handle, list(range(16)))
        exporting.add_ready(handle, list(range(8)))
        exporting.finish_export(handle, list(range(8, 16)), ExportDone(5))
        status = task.wait(20)
        assert status.state is TransferState.DONE and task.export_done == ExportDone(5)
        assert np.array_equal(source.data, dest.data)
        assert importing.metrics.snapshot().pulls_by_path == {"same_node": 1}
    finally:
        importing.close()
        exporting.close()


def test_a_corrupt_block_fails_its_check_on_the_same_node_path(
    config: TransferConfig,
    shared_store: Callable[..., NumpyBlockStore],
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source, dest = shared_store(8, seed=1), make_store(8)
    server = make_server(source, config, faults=FaultInjection(corrupt_chunk_seq=0))
    client = make_client(dest, config)
    status = client.pull(server.export(list(range(8))), list(range(8))).wait(20)
    assert status.state is TransferState.FAILED
    assert status.reason is TransferFailure.CORRUPT_CHUNK
    assert wait_until(lambda: server.exporter.num_live_exports() == 0)


def test_a_failed_in_process_same_node_pull_ends_the_export_side_too(
    shared_store: Callable[..., NumpyBlockStore], make_store: Callable[..., NumpyBlockStore]
) -> None:
    source, dest = shared_store(8, seed=1), make_store(8)
    hub = InProcKVHub()
    fault = FaultInjection(corrupt_chunk_seq=1)
    exporting = InProcKVTransport(source, hub, chunk_bytes=2 * LAYOUT.block_bytes, faults=fault)
    importing = InProcKVTransport(dest, hub)
    try:
        released: list[ReleaseCause] = []
        handle = exporting.export(list(range(8)), released.append)
        status = importing.pull(handle, list(range(8))).wait(20)
        assert status.reason is TransferFailure.CORRUPT_CHUNK
        assert released == [ReleaseCause.RELEASED]
        # the exporter's location stream ended with the pull, not at garbage collection
        assert exporting.metrics.snapshot().in_flight == {TransferSide.EXPORT: 0}
    finally:
        importing.close()
        exporting.close()


def test_a_layout_mismatch_is_refused_before_any_block_is_read(
    config: TransferConfig,
    shared_store: Callable[..., NumpyBlockStore],
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source = shared_store(4, seed=2)
    other = KVLayout("other-model", "float32", 16, 2, 2, 32, 0)
    dest = make_store(4, other)
    server, client = make_server(source, config), make_client(dest, config)
    status = client.pull(server.export([0, 1]), [0, 1]).wait(20)
    assert status.state is TransferState.FAILED
    assert status.reason is TransferFailure.LAYOUT_MISMATCH
    assert not dest.data.any()


@pytest.mark.parametrize("why", ["off", "no_region", "other_node", "unmapped"])
def test_every_reason_to_take_grpc_falls_back_and_is_counted(
    why: str,
    config: TransferConfig,
    shared_store: Callable[..., NumpyBlockStore],
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source = make_store(8, seed=4) if why == "no_region" else shared_store(8, seed=4)
    if why == "no_region":
        source.fill_random(4)
    dest = make_store(8)
    server = make_server(source, config)
    importer_config = config.model_copy(update={"same_node": "off" if why == "off" else "auto"})
    client = make_client(dest, importer_config)
    handle = server.export(list(range(8)))
    if why == "other_node":
        handle = dataclasses.replace(handle, node_id="elsewhere/0")
    if why == "unmapped":
        os.unlink(os.path.join(SHM_DIR, handle.shared_region))
    status = client.pull(handle, list(range(8))).wait(20)
    assert status.state is TransferState.DONE, status
    assert np.array_equal(source.data, dest.data)  # over gRPC
    assert paths(client) == ({"grpc": 1}, {why: 1})
