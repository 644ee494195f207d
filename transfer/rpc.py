"""How ``pdserve.kv.v1.KVTransfer`` is bound to gRPC, for the server and the client alike.

The unary methods use the generated protobuf classes. ``Pull`` responses bypass them: the server
yields chunks already serialized by ``transfer.chunk_wire`` and the client receives the raw
bytes and decodes them itself, so each payload is copied once per side (see
``transfer.chunk_wire``). Message size limits are set explicitly on both ends from the same config.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from core.config import TransferConfig
from transfer.proto._generated import kv_transfer_pb2 as pb

SERVICE_NAME = "pdserve.kv.v1.KVTransfer"
PULL_METHOD = f"/{SERVICE_NAME}/Pull"
HEARTBEAT_METHOD = f"/{SERVICE_NAME}/Heartbeat"
RELEASE_METHOD = f"/{SERVICE_NAME}/Release"
AWAIT_METHOD = f"/{SERVICE_NAME}/Await"


def message_options(config: TransferConfig) -> list[tuple[str, str | int]]:
    """Explicit max send/receive message sizes for a server or channel."""
    return [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
    ]


class KVTransferHandlers(Protocol):
    """The server-side behaviour of the four methods."""

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        """Yield serialized ``Chunk`` messages (``transfer.chunk_wire.encode_chunk``)."""
        ...

    def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatResponse:
        """Extend a lease."""
        ...

    def Release(
        self, request: pb.ReleaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseResponse:
        """Free an export."""
        ...

    def Await(self, request: pb.AwaitRequest, context: grpc.ServicerContext) -> pb.AwaitResponse:
        """Wait for a pipelined export's blocks or its end."""
        ...


def generic_handler(handlers: KVTransferHandlers) -> grpc.GenericRpcHandler:
    """The service's method table for ``grpc.Server.add_generic_rpc_handlers``."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Pull": grpc.unary_stream_rpc_method_handler(
                handlers.Pull,
                request_deserializer=pb.PullRequest.FromString,
                response_serializer=None,  # already serialized
            ),
            "Heartbeat": grpc.unary_unary_rpc_method_handler(
                handlers.Heartbeat,
                request_deserializer=pb.HeartbeatRequest.FromString,
                response_serializer=pb.HeartbeatResponse.SerializeToString,
            ),
            "Release": grpc.unary_unary_rpc_method_handler(
                handlers.Release,
                request_deserializer=pb.ReleaseRequest.FromString,
                response_serializer=pb.ReleaseResponse.SerializeToString,
            ),
            "Await": grpc.unary_unary_rpc_method_handler(
                handlers.Await,
                request_deserializer=pb.AwaitRequest.FromString,
                response_serializer=pb.AwaitResponse.SerializeToString,
            ),
        },
    )


class KVTransferClientMethods:
    """Callables for the four methods on one channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.pull: Callable[..., Any] = channel.unary_stream(
            PULL_METHOD,
            request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=None,  # raw bytes; decoded by transfer.chunk_wire
        )
        self.heartbeat: Callable[..., Any] = channel.unary_unary(
            HEARTBEAT_METHOD,
            request_serializer=pb.HeartbeatRequest.SerializeToString,
            response_deserializer=pb.HeartbeatResponse.FromString,
        )
        self.release: Callable[..., Any] = channel.unary_unary(
            RELEASE_METHOD,
            request_serializer=pb.ReleaseRequest.SerializeToString,
            response_deserializer=pb.ReleaseResponse.FromString,
        )
        self.await_: Callable[..., Any] = channel.unary_unary(
            AWAIT_METHOD,
            request_serializer=pb.AwaitRequest.SerializeToString,
            response_deserializer=pb.AwaitResponse.FromString,
        )
