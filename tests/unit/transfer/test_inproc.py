"""The in-process transport keeps the gRPC transport's contract, and the task API."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from core.codec import from_plain, to_plain
from core.errors import TransferError
from core.kv_handle import KVHandle, TransferFailure, TransferState
from transfer import (
    FaultInjection,
    InProcKVHub,
    InProcKVTransport,
    KVTransport,
    NumpyBlockStore,
    ReleaseCause,
    TransferTask,
)

pytestmark = pytest.mark.timeout(30)

MakeStore = Callable[..., NumpyBlockStore]


@pytest.fixture
def hub_pair(
    make_store: MakeStore,
) -> Iterator[tuple[InProcKVTransport, InProcKVTransport]]:
    hub = InProcKVHub()
    prefill = InProcKVTransport(make_store(64, seed=5), hub, chunk_bytes=64 * 1024)
    decode = InProcKVTransport(make_store(64), hub, chunk_bytes=64 * 1024)
    yield prefill, decode
    decode.close()
    prefill.close()


def test_inproc_transport_satisfies_the_contract(
    hub_pair: tuple[InProcKVTransport, InProcKVTransport],
) -> None:
    prefill, decode = hub_pair
    transport: KVTransport = decode  # structural check
    released: list[ReleaseCause] = []
    handle = prefill.export(range(10, 30), released.append)
    assert handle.address == prefill.address and handle.address.startswith("inproc://")
    assert transport.heartbeat(handle) >= handle.lease_deadline_unix_ms
    decode.pull(handle, range(40, 60)).result(timeout_s=10)
    source, dest = prefill.exporter.store, decode.exporter.store
    assert isinstance(source, NumpyBlockStore) and isinstance(dest, NumpyBlockStore)
    np.testing.assert_array_equal(dest.data[40:60], source.data[10:30])
    assert released == [ReleaseCause.COMPLETED]


@pytest.mark.parametrize(
    ("faults", "reason"),
    [
        (FaultInjection(corrupt_chunk_seq=0), TransferFailure.CORRUPT_CHUNK),
        (FaultInjection(fail_after_chunks=2), TransferFailure.EXPORTER_ERROR),
    ],
)
def test_inproc_faults_fail_the_same_way(
    hub_pair: tuple[InProcKVTransport, InProcKVTransport],
    faults: FaultInjection,
    reason: TransferFailure,
    waiter: Callable[..., bool],
) -> None:
    prefill, decode = hub_pair
    prefill.set_faults(faults)
    released: list[ReleaseCause] = []
    status = decode.pull(prefill.export(range(20), released.append), range(20)).wait(10)
    assert status.state is TransferState.FAILED and status.reason == reason
    assert waiter(lambda: released == [ReleaseCause.RELEASED])


def test_inproc_unknown_address_and_stopped_exporter(
    hub_pair: tuple[InProcKVTransport, InProcKVTransport], make_store: MakeStore
) -> None:
    prefill, decode = hub_pair
    handle = prefill.export(range(4))
    ghost = dataclasses.replace(handle, address="inproc://999")
    status = decode.pull(ghost, range(4)).wait(10)
    assert status.reason == TransferFailure.EXPORTER_UNAVAILABLE
    with pytest.raises(TransferError) as info:
        decode.release(ghost)
    assert info.value.reason == TransferFailure.EXPORTER_UNAVAILABLE
    decode.release(handle)
    assert decode.pull(handle, range(4)).wait(10).reason == TransferFailure.UNKNOWN_TRANSFER


def test_inproc_lease_expiry(make_store: MakeStore, waiter: Callable[..., bool]) -> None:
    hub = InProcKVHub()
    prefill = InProcKVTransport(make_store(4, seed=1), hub, lease_s=0.05)
    decode = InProcKVTransport(make_store(4), hub)
    try:
        released: list[ReleaseCause] = []
        handle = prefill.export([0, 1], released.append)
        assert waiter(lambda: released == [ReleaseCause.EXPIRED])
        assert decode.pull(handle, [2, 3]).wait(10).reason == TransferFailure.LEASE_EXPIRED
    finally:
        decode.close()
        prefill.close()


def test_task_callbacks_wait_and_result() -> None:
    task = TransferTask("xfer-1", (3, 4), 100)
    seen: list[TransferState] = []
    task.add_done_callback(lambda t: seen.append(t.state))
    assert task.wait(timeout_s=0.01).state is TransferState.PENDING
    with pytest.raises(TimeoutError):
        task.result(timeout_s=0.01)
    task.mark_transferring()
    task.mark_progress(40)
    task.mark_failed(TransferFailure.CORRUPT_CHUNK, "bad crc", (4,))
    task.mark_done()  # terminal states never change
    status = task.status()
    assert (status.state, status.reason, status.bytes_done) == (
        TransferState.FAILED,
        TransferFailure.CORRUPT_CHUNK,
        40,
    )
    assert status.invalid_block_ids == (4,)
    assert seen == [TransferState.FAILED]
    task.add_done_callback(lambda t: seen.append(t.state))  # already terminal: runs at once
    assert seen == [TransferState.FAILED, TransferState.FAILED]
    with pytest.raises(TransferError) as info:
        task.result()
    assert info.value.reason == TransferFailure.CORRUPT_CHUNK


def test_task_future_resolves_for_asyncio() -> None:
    import asyncio

    task = TransferTask("xfer-2", (0,), 10)

    async def main() -> TransferState:
        loop = asyncio.get_running_loop()
        loop.call_soon(task.mark_done)
        status = await asyncio.wrap_future(task.as_future())
        return status.state

    assert asyncio.run(main()) is TransferState.DONE


def test_handle_round_trips_through_a_dict() -> None:
    handle = KVHandle("xfer-1", "10.0.0.1:5000", 3, 4096, "ab" * 8, 1_700_000_000_000, "e1")
    assert from_plain(KVHandle, json.loads(json.dumps(to_plain(handle)))) == handle
    assert TransferState.DONE.is_terminal and not TransferState.TRANSFERRING.is_terminal
