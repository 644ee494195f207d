"""The device path: a same-node importer copies blocks straight out of the exporter's device KV
(CUDA IPC on a GPU), the stream carrying only block ids, each sent once its blocks are
computed. Here the "device" is a second numpy array per store beside its host bytes, so every
test can see that the device bytes moved and the host bytes did not; the CUDA mapping itself is
tested in ``tests/gpu/test_cuda_ipc_gpu.py``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

from core.config import TransferConfig
from core.errors import TransferError
from core.kv_handle import ExportDone, TransferFailure, TransferState
from core.kv_layout import KVLayout
from tests.unit.transfer.block_layout import LAYOUT
from transfer import (
    InProcKVHub,
    InProcKVTransport,
    KVExportServer,
    KVImportClient,
    NumpyBlockStore,
    ReleaseCause,
)
from transfer.device_path import NO_CHECKSUM, DeviceCopyWriter
from transfer.same_node import Locations

pytestmark = pytest.mark.timeout(60)

_REGIONS: dict[str, DeviceStore] = {}
_NAMES = itertools.count()


class _Peer:
    """A fake mapping: copies device rows of the exporter's store into the importer's."""

    def __init__(self, src: DeviceStore, dst: DeviceStore) -> None:
        self.src, self.dst = src, dst
        self.fenced = 0

    def copy_blocks(self, src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> None:
        self.dst.device[list(dst_block_ids)] = self.src.device[list(src_block_ids)]

    def fence(self) -> None:
        self.fenced += 1


class DeviceStore(NumpyBlockStore):
    """A store with a "device" copy of its blocks that same-process peers can map."""

    def __init__(self, layout: KVLayout, num_blocks: int, *, mappable: bool = True) -> None:
        super().__init__(layout, num_blocks, shared=True)
        self.device = np.zeros_like(self.data)
        self.region = f"fake-device-{next(_NAMES)}"
        self.mappable = mappable
        self.computed: list[int] = []
        self.peers: list[_Peer] = []
        _REGIONS[self.region] = self

    @property
    def device_region(self) -> str | None:
        return self.region

    def wait_computed(self, block_ids: Sequence[int]) -> None:
        self.computed.extend(block_ids)

    def open_device_peer(self, region: str) -> _Peer:
        source = _REGIONS.get(region)
        if source is None or not self.mappable:
            raise RuntimeError(f"cannot map {region}")
        self.peers.append(_Peer(source, self))
        return self.peers[-1]


@pytest.fixture
def device_store() -> Iterator[Callable[..., DeviceStore]]:
    """``device_store(num_blocks, seed=None, mappable=True)``: device bytes random when
    seeded; its shared host segment is unlinked at teardown."""
    stores: list[DeviceStore] = []

    def make(num_blocks: int, seed: int | None = None, mappable: bool = True) -> DeviceStore:
        store = DeviceStore(LAYOUT, num_blocks, mappable=mappable)
        if seed is not None:
            store.device[:] = np.random.default_rng(seed).integers(0, 256, store.device.shape)
            store.data[:] = store.device  # what staging to the host mirror would have done
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()
        _REGIONS.pop(store.region, None)


def paths(client: KVImportClient | InProcKVTransport) -> tuple[dict[str, int], dict[str, int]]:
    stats = client.metrics.snapshot()
    return dict(stats.pulls_by_path or {}), dict(stats.same_node_fallbacks or {})


def test_a_device_pull_copies_device_to_device_and_completes_the_export(
    config: TransferConfig,
    device_store: Callable[..., DeviceStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    waiter: Callable[..., bool],
) -> None:
    source, dest = device_store(40, seed=3), device_store(48)
    server, client = make_server(source, config), make_client(dest, config)
    released: list[ReleaseCause] = []
    handle = server.export(list(range(5, 37)), released.append)
    assert handle.device_region == source.region
    wanted, dst = list(range(2, 32)), list(range(10, 40))
    task = client.pull(handle, dst, wanted)
    status = task.wait(20)
    assert status.state is TransferState.DONE, status
    assert task.on_device  # the decode stages nothing from its host mirror
    for w, d in zip(wanted, dst, strict=True):
        assert np.array_equal(source.device[5 + w], dest.device[d])
    assert not dest.data.any()  # the host bytes never moved
    assert sorted(source.computed) == sorted(5 + w for w in wanted)
    assert dest.peers[0].fenced == 1
    assert paths(client) == ({"cuda_ipc": 1}, {})
    assert waiter(lambda: released == [ReleaseCause.COMPLETED])


def test_a_pipelined_export_takes_the_device_path_as_its_blocks_become_ready(
    device_store: Callable[..., DeviceStore],
) -> None:
    source, dest = device_store(16, seed=8), device_store(16)
    hub = InProcKVHub()
    exporting, importing = InProcKVTransport(source, hub), InProcKVTransport(dest, hub)
    try:
        handle = exporting.open_export(16)
        task = importing.pull(handle, list(range(16)))
        exporting.add_ready(handle, list(range(8)))
        exporting.finish_export(handle, list(range(8, 16)), ExportDone(5))
        status = task.wait(20)
        assert status.state is TransferState.DONE and task.export_done == ExportDone(5)
        assert task.on_device and np.array_equal(source.device, dest.device)
        assert paths(importing) == ({"cuda_ipc": 1}, {})
    finally:
        importing.close()
        exporting.close()


@pytest.mark.parametrize(
    ("mode", "mappable", "path", "fallbacks"),
    [
        ("host", True, "same_node", {}),  # host: only the shared-memory path
        ("auto", False, "same_node", {"ipc_unavailable": 1}),
        ("off", True, "grpc", {"off": 1}),
    ],
)
def test_without_the_device_path_the_pull_takes_host_memory_or_grpc_and_says_why(
    mode: str,
    mappable: bool,
    path: str,
    fallbacks: dict[str, int],
    config: TransferConfig,
    device_store: Callable[..., DeviceStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source, dest = device_store(8, seed=4), device_store(8, mappable=mappable)
    server = make_server(source, config)
    client = make_client(dest, config.model_copy(update={"same_node": mode}))
    task = client.pull(server.export(list(range(8))), list(range(8)))
    assert task.wait(20).state is TransferState.DONE
    assert not task.on_device and np.array_equal(source.data, dest.data)  # host bytes
    assert not dest.device.any()
    assert paths(client) == ({path: 1}, fallbacks)


def test_an_exporter_without_device_memory_refuses_a_device_stream(
    make_store: Callable[..., NumpyBlockStore],
) -> None:
    hub = InProcKVHub()
    exporting = InProcKVTransport(make_store(4, seed=1), hub)
    try:
        handle = exporting.export([0, 1])
        assert handle.device_region == ""
        with pytest.raises(TransferError) as raised:
            exporting.exporter.pull_locations(
                handle.transfer_id,
                [],
                handle.layout_fingerprint,
                handle.exporter_epoch,
                cancelled=None,  # type: ignore[arg-type]
                encode=lambda *fields: fields,
                device=True,
            )
        assert raised.value.reason is TransferFailure.INVALID_REQUEST
    finally:
        exporting.close()


def test_the_device_writer_takes_only_its_own_stream_in_order(
    device_store: Callable[..., DeviceStore],
) -> None:
    source, dest = device_store(8, seed=2), device_store(8)
    bb = LAYOUT.block_bytes
    writer = DeviceCopyWriter(dest.open_device_peer(source.region), [4, 5, 6], bb)
    bad = [
        Locations(0, 3 * bb, 1, 123, (0, 1)),  # a checksummed (host) chunk
        Locations(bb, 3 * bb, NO_CHECKSUM, 0, (0,)),  # out of order
        Locations(0, 2 * bb, NO_CHECKSUM, 0, (0,)),  # another stream's size
        Locations(0, 3 * bb, NO_CHECKSUM, 0, (0, 1, 2, 3)),  # too many blocks
    ]
    for chunk in bad:
        with pytest.raises(TransferError) as raised:
            writer.take(chunk)
        assert raised.value.reason is TransferFailure.BAD_CHUNK
    writer.take(Locations(0, 3 * bb, NO_CHECKSUM, 0, (7, 0)))
    assert writer.invalid_block_ids() == (4, 5, 6)  # copied, not yet waited for
    with pytest.raises(TransferError):
        writer.finish()  # one block short
    writer.take(Locations(2 * bb, 3 * bb, NO_CHECKSUM, 0, (3,)))
    writer.finish()
    assert writer.invalid_block_ids() == ()
    assert np.array_equal(dest.device[[4, 5, 6]], source.device[[7, 0, 3]])
