"""Mapping between ``TransferFailure`` reasons and gRPC status codes, both directions.

The server aborts a call with the status code for the reason and also names the reason in the
trailing metadata key ``pdserve-reason``; the client prefers that key and falls back to the code
when the failure came from the transport itself (peer gone, deadline, TLS handshake).
"""

from __future__ import annotations

import grpc

from core.kv_handle import TransferFailure

REASON_METADATA_KEY = "pdserve-reason"

_CODE_FOR_REASON: dict[TransferFailure, grpc.StatusCode] = {
    TransferFailure.UNKNOWN_TRANSFER: grpc.StatusCode.NOT_FOUND,
    TransferFailure.LEASE_EXPIRED: grpc.StatusCode.NOT_FOUND,
    TransferFailure.PEER_RESTARTED: grpc.StatusCode.NOT_FOUND,
    TransferFailure.LAYOUT_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    TransferFailure.KV_INCOMPATIBLE: grpc.StatusCode.FAILED_PRECONDITION,
    TransferFailure.ALREADY_PULLING: grpc.StatusCode.FAILED_PRECONDITION,
    TransferFailure.INVALID_REQUEST: grpc.StatusCode.OUT_OF_RANGE,
    TransferFailure.NOT_READY: grpc.StatusCode.FAILED_PRECONDITION,
    TransferFailure.EXPORTER_ERROR: grpc.StatusCode.ABORTED,
    TransferFailure.EXPORTER_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    TransferFailure.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    TransferFailure.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    TransferFailure.CANCELLED: grpc.StatusCode.CANCELLED,
}

_REASON_FOR_CODE: dict[grpc.StatusCode, TransferFailure] = {
    grpc.StatusCode.UNAVAILABLE: TransferFailure.EXPORTER_UNAVAILABLE,
    # A server that shuts down cancels its streams; our own cancels are recognised by the task.
    grpc.StatusCode.CANCELLED: TransferFailure.EXPORTER_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransferFailure.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAUTHENTICATED: TransferFailure.UNAUTHENTICATED,
    grpc.StatusCode.NOT_FOUND: TransferFailure.UNKNOWN_TRANSFER,
    grpc.StatusCode.FAILED_PRECONDITION: TransferFailure.LAYOUT_MISMATCH,
    grpc.StatusCode.OUT_OF_RANGE: TransferFailure.INVALID_REQUEST,
    grpc.StatusCode.INVALID_ARGUMENT: TransferFailure.INVALID_REQUEST,
}


def code_for(reason: TransferFailure) -> grpc.StatusCode:
    """The status code a server answers for ``reason``."""
    return _CODE_FOR_REASON.get(reason, grpc.StatusCode.INTERNAL)


def reason_for(error: grpc.RpcError) -> TransferFailure:
    """The ``TransferFailure`` of a failed call: the server's named reason, else by code."""
    trailing = error.trailing_metadata() if isinstance(error, grpc.Call) else None
    for key, value in trailing or ():
        if key == REASON_METADATA_KEY:
            text = value.decode() if isinstance(value, bytes) else value
            try:
                return TransferFailure(text)
            except ValueError:
                break  # a newer peer's reason: fall back to the code
    code = error.code() if isinstance(error, grpc.Call) else None
    if code is None:
        return TransferFailure.EXPORTER_ERROR
    return _REASON_FOR_CODE.get(code, TransferFailure.EXPORTER_ERROR)


def details_of(error: grpc.RpcError) -> str:
    """The status code and details of a failed call, for messages."""
    if isinstance(error, grpc.Call):
        return f"{error.code().name}: {error.details()}"
    return repr(error)
