"""The export server's gRPC statuses for bad requests; none of them changes any state."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from core.config import TransferConfig
from core.kv_handle import KVHandle
from transfer import FaultInjection, KVExportServer, NumpyBlockStore, ReleaseCause, TransferSide
from transfer.chunk_wire import decode_chunk
from transfer.proto._generated import kv_transfer_pb2 as pb
from transfer.rpc import KVTransferClientMethods
from transfer.status_codes import REASON_METADATA_KEY

pytestmark = pytest.mark.timeout(30)

TOKEN_METADATA = (("authorization", "Bearer unit-test-token"),)


@pytest.fixture
def served(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
) -> Iterator[tuple[KVExportServer, KVTransferClientMethods, KVHandle, list[ReleaseCause]]]:
    server = make_server(make_store(8, seed=9), config)
    released: list[ReleaseCause] = []
    handle = server.export([2, 3, 4], released.append)
    with grpc.insecure_channel(server.address) as channel:
        yield server, KVTransferClientMethods(channel), handle, released


def pull_request(handle: KVHandle, **overrides: object) -> pb.PullRequest:
    fields: dict[str, object] = {
        "transfer_id": handle.transfer_id,
        "layout_fingerprint": handle.layout_fingerprint,
        "exporter_epoch": handle.exporter_epoch,
    }
    fields.update(overrides)
    return pb.PullRequest(**fields)  # type: ignore[arg-type]


def reason_of(error: grpc.RpcError) -> str:
    return dict(error.trailing_metadata() or ())[REASON_METADATA_KEY]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("overrides", "code", "reason"),
    [
        ({"transfer_id": "xfer-unknown"}, grpc.StatusCode.NOT_FOUND, "unknown_transfer"),
        ({"exporter_epoch": "old"}, grpc.StatusCode.NOT_FOUND, "peer_restarted"),
        ({"block_indices": [0, 3]}, grpc.StatusCode.OUT_OF_RANGE, "invalid_request"),
        ({"block_indices": [1, 1]}, grpc.StatusCode.OUT_OF_RANGE, "invalid_request"),
        ({"layout_fingerprint": "0" * 16}, grpc.StatusCode.FAILED_PRECONDITION, "layout_mismatch"),
        ({"kv_compat": "0" * 16}, grpc.StatusCode.FAILED_PRECONDITION, "kv_incompatible"),
    ],
)
def test_bad_pulls_get_their_status_and_change_nothing(
    served: tuple[KVExportServer, KVTransferClientMethods, KVHandle, list[ReleaseCause]],
    overrides: dict[str, object],
    code: grpc.StatusCode,
    reason: str,
) -> None:
    server, methods, handle, released = served
    with pytest.raises(grpc.RpcError) as info:
        list(methods.pull(pull_request(handle, **overrides), metadata=TOKEN_METADATA, timeout=5))
    assert info.value.code() == code  # type: ignore[attr-defined]
    assert reason_of(info.value) == reason
    assert released == [] and server.exporter.num_live_exports() == 1
    chunks = [
        decode_chunk(m)
        for m in methods.pull(pull_request(handle), metadata=TOKEN_METADATA, timeout=5)
    ]
    assert sum(len(c.payload) for c in chunks) == 3 * handle.block_bytes  # still intact
    assert released == [ReleaseCause.COMPLETED]


def test_a_second_concurrent_pull_is_refused(
    served: tuple[KVExportServer, KVTransferClientMethods, KVHandle, list[ReleaseCause]],
    waiter: Callable[..., bool],
) -> None:
    server, methods, handle, released = served
    server.set_faults(FaultInjection(delay_per_chunk_s=30.0))
    first = methods.pull(pull_request(handle), metadata=TOKEN_METADATA, timeout=10)
    assert waiter(lambda: server.metrics.snapshot().in_flight.get(TransferSide.EXPORT) == 1)
    with pytest.raises(grpc.RpcError) as info:
        list(methods.pull(pull_request(handle), metadata=TOKEN_METADATA, timeout=5))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert reason_of(info.value) == "already_pulling"
    assert released == []
    first.cancel()
    assert waiter(lambda: server.metrics.snapshot().in_flight.get(TransferSide.EXPORT) == 0)
    assert released == [] and server.exporter.num_live_exports() == 1


@pytest.mark.parametrize("method", ["heartbeat", "release"])
def test_unary_calls_for_unknown_ids_are_not_found(
    served: tuple[KVExportServer, KVTransferClientMethods, KVHandle, list[ReleaseCause]],
    method: str,
) -> None:
    server, methods, _, released = served
    request = (pb.HeartbeatRequest if method == "heartbeat" else pb.ReleaseRequest)(
        transfer_id="xfer-unknown"
    )
    with pytest.raises(grpc.RpcError) as info:
        getattr(methods, method)(request, metadata=TOKEN_METADATA, timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert released == [] and server.exporter.num_live_exports() == 1


def test_release_then_late_messages_are_ignored(
    served: tuple[KVExportServer, KVTransferClientMethods, KVHandle, list[ReleaseCause]],
) -> None:
    _, methods, handle, released = served
    release = pb.ReleaseRequest(transfer_id=handle.transfer_id)
    methods.release(release, metadata=TOKEN_METADATA, timeout=5)
    assert released == [ReleaseCause.RELEASED]
    for call in (
        lambda: methods.release(release, metadata=TOKEN_METADATA, timeout=5),
        lambda: methods.heartbeat(
            pb.HeartbeatRequest(transfer_id=handle.transfer_id), metadata=TOKEN_METADATA, timeout=5
        ),
        lambda: list(methods.pull(pull_request(handle), metadata=TOKEN_METADATA, timeout=5)),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert released == [ReleaseCause.RELEASED]
