"""The KV event stream: packed frames round-trip, a shard's server applies them in order and
answers resync requests, and a connection without the shard's token is refused."""

from __future__ import annotations

import socket
import threading

import pytest

from cluster.routing.kv_index.replication import KVIndexServer
from cluster.routing.kv_index.stream import (
    StreamClient,
    StreamError,
    StreamServer,
    decode_batches,
    encode_batches,
)
from core.errors import MessageError
from core.kv_index_messages import CompactBatch, IndexOp, PublishReply

BATCHES: list[CompactBatch] = [
    CompactBatch(
        0, (IndexOp("stored", [1, 2, 2**64 - 1], "device"), IndexOp("removed", [2], "host"))
    ),
    CompactBatch(1, (IndexOp("cleared", [], "device"), IndexOp("stored", [7], "disk"))),
    CompactBatch(2),
]


def test_frames_round_trip_and_bad_frames_are_named() -> None:
    frame = encode_batches(BATCHES)
    assert decode_batches(frame[5:]) == BATCHES  # after the length and the kind byte
    with pytest.raises(StreamError, match="unreadable"):
        decode_batches(frame[5:-4])  # cut inside the last batch's header
    single = encode_batches(BATCHES[:1])
    with pytest.raises(StreamError, match="inside its hashes"):
        decode_batches(single[5:-4])
    with pytest.raises(StreamError, match="trailing"):
        decode_batches(frame[5:] + b"\x00")
    with pytest.raises(StreamError, match="unreadable"):
        decode_batches(b"\x01")
    bad_medium = bytearray(single[5:])
    bad_medium[2 + 10 + 1] = 7  # the first op's medium byte: no such medium
    with pytest.raises(MessageError, match="unreadable"):  # a StreamError is a MessageError
        decode_batches(bytes(bad_medium))


class LockedServer:
    """What the actor does: one lock around the server, publish called from stream threads."""

    def __init__(self) -> None:
        self.server = KVIndexServer()
        self.lock = threading.Lock()

    def publish(self, replica_id: str, batches: list[CompactBatch]) -> PublishReply:
        with self.lock:
            return self.server.publish(replica_id, batches)


def test_a_stream_applies_batches_in_order_and_asks_for_resyncs() -> None:
    shard = LockedServer()
    stream = StreamServer(shard.publish, host="127.0.0.1")
    try:
        shard.server.resync("a", "prefill", [], 0)
        client = StreamClient(stream.endpoint(), "a", timeout_s=5.0)
        assert client.publish(BATCHES[:1]) == PublishReply(resync=False)
        assert client.publish(BATCHES[1:]) == PublishReply(resync=False)
        assert shard.server.index.match_tiers("prefill", [7]) != {}
        assert shard.server.index.last_seq("a") == 2
        assert client.publish([CompactBatch(9)]) == PublishReply(resync=True)  # a gap
        unknown = StreamClient(stream.endpoint(), "b", timeout_s=5.0)
        assert unknown.publish(BATCHES[:1]) == PublishReply(resync=True)  # never registered
        client.close()
        unknown.close()
    finally:
        stream.close()


def test_a_connection_without_the_token_is_refused() -> None:
    shard = LockedServer()
    stream = StreamServer(shard.publish, host="127.0.0.1")
    try:
        host, port, _ = stream.endpoint()
        with pytest.raises(ConnectionRefusedError):
            StreamClient((host, port, b"\x00" * 16), "a", timeout_s=5.0)
        client = StreamClient(stream.endpoint(), "a", timeout_s=5.0)
        client._sock.sendall(b"\x05\x00\x00\x00\x07junk")  # an unknown frame kind
        assert client._sock.recv(1) == b"\x02"
        client.close()
        with socket.create_connection((host, port), timeout=5.0) as raw:
            raw.sendall(b"\xff\xff\xff\xff")  # an absurd frame length
            assert raw.recv(1) == b"\x02"
    finally:
        stream.close()
