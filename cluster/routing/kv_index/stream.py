"""The KV event stream: replicas' batches to their index shard over one TCP connection each.

Why not a Ray actor call per batch: on the machines this was measured on, one actor call costs
the shard ~0.3 ms of CPU before it applies a single event, and every replica publishes up to a
hundred times a second, so a shard following a few dozen replicas spent most of its core on
calls (``benchmarks/control_plane_scale.py``). A frame on a connection that stays open costs
tens of microseconds. Registration, snapshots and removals stay Ray calls: they are rare.

The shard (:class:`StreamServer`, one thread inside the index actor) listens on its node's
address; :meth:`StreamServer.endpoint` (an actor method) hands out ``(host, port, token)``, so
only a process that can call the actor through Ray learns the token a connection must present.
No pickle: frames are length-prefixed and packed with ``struct``, hashes as little-endian u64;
a frame is the wire form of ``core.kv_index_messages``' :class:`~core.kv_index_messages.
CompactBatch` es and the answer byte that of a :class:`~core.kv_index_messages.PublishReply`
(packed by hand rather than through ``core.codec``: this channel carries every cache event, and
its cost per event is what the stream exists for). An unreadable frame is refused with a
:class:`StreamError`, a :class:`~core.errors.MessageError`.

    hello   u32 len | u8 0 | 16-byte token | replica id (utf-8)
    batches u32 len | u8 1 | u16 n | n x (u64 seq | u16 n_ops | n_ops x op)
    op      u8 kind | u8 medium | u32 n | n x u64 hash
    reply   u8: 0 applied, 1 resync wanted, 2 refused (bad token or frame)
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import selectors
import socket
import struct
import threading
from array import array
from collections.abc import Callable, Sequence

from cluster.routing.kv_index.compaction import OP_CLEARED, OP_REMOVED, OP_STORED
from core.errors import MessageError
from core.kv_events import MEDIA
from core.kv_index_messages import CompactBatch, IndexOp, OpKind, PublishReply

logger = logging.getLogger(__name__)

TOKEN_BYTES = 16
HELLO, BATCHES = 0, 1
APPLIED, RESYNC, REFUSED = 0, 1, 2
MAX_FRAME_BYTES = 256 << 20
_KINDS: tuple[OpKind, ...] = (OP_STORED, OP_REMOVED, OP_CLEARED)
_MEDIA = MEDIA
_LEN = struct.Struct("<I")
_BATCH = struct.Struct("<QH")
_OP = struct.Struct("<BBI")

Publish = Callable[[str, list[CompactBatch]], PublishReply]
"""``KVIndexServer.publish``: (replica id, compact batches) -> its reply."""


class StreamError(MessageError):
    """A frame that cannot be read (truncated, an unknown kind or medium, a bad token)."""


def encode_hello(token: bytes, replica_id: str) -> bytes:
    """The first frame of a connection."""
    body = bytes([HELLO]) + token + replica_id.encode("utf-8", "surrogatepass")
    return _LEN.pack(len(body)) + body


def encode_batches(batches: Sequence[CompactBatch]) -> bytes:
    """A frame of compact batches."""
    parts = [bytes([BATCHES]), struct.pack("<H", len(batches))]
    for batch in batches:
        parts.append(_BATCH.pack(batch.replica_seq, len(batch.ops)))
        for op in batch.ops:
            parts.append(_OP.pack(_KINDS.index(op.kind), _MEDIA.index(op.medium), len(op.hashes)))
            parts.append(array("Q", op.hashes).tobytes())
    body = b"".join(parts)
    return _LEN.pack(len(body)) + body


def decode_batches(body: bytes | memoryview) -> list[CompactBatch]:
    """The batches of a ``BATCHES`` frame body (after its kind byte)."""
    view = memoryview(body)
    try:
        (count,) = struct.unpack_from("<H", view, 0)
        offset, batches = 2, []
        for _ in range(count):
            seq, num_ops = _BATCH.unpack_from(view, offset)
            offset += _BATCH.size
            ops: list[IndexOp] = []
            for _ in range(num_ops):
                kind, medium, num_hashes = _OP.unpack_from(view, offset)
                offset += _OP.size
                end = offset + 8 * num_hashes
                if end > len(view):
                    raise StreamError("a batch frame ends inside its hashes")
                hashes = array("Q")
                hashes.frombytes(view[offset:end])
                offset = end
                ops.append(IndexOp(_KINDS[kind], hashes.tolist(), _MEDIA[medium]))
            batches.append(CompactBatch(seq, tuple(ops)))
    except (struct.error, IndexError) as e:
        raise StreamError(f"unreadable batch frame: {e}") from e
    if offset != len(view):
        raise StreamError("a batch frame has trailing bytes")
    return batches


def _read_exact(sock: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("the KV event stream closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class StreamServer:
    """Accepts replicas' connections and applies their frames with ``publish``, all on one
    thread that waits on every socket at once (a thread per connection would spend the shard's
    core handing the GIL around). ``publish`` must be safe to call from that thread beside the
    actor's own: the actor takes a lock."""

    def __init__(self, publish: Publish, host: str = "0.0.0.0", advertise: str = "") -> None:
        self._publish = publish
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.host = advertise or host
        self.port = int(self._listener.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._closed = threading.Event()
        threading.Thread(target=self._run, name="kv-event-stream", daemon=True).start()

    def endpoint(self) -> tuple[str, int, bytes]:
        """Where to connect and the token to present."""
        return self.host, self.port, self.token

    def close(self) -> None:
        """Stop serving and close every connection."""
        self._closed.set()

    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select(timeout=0.5):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.fileobj, key.data)  # type: ignore[arg-type]
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setblocking(False)
        self._selector.register(conn, selectors.EVENT_READ, _Connection())

    def _read(self, conn: socket.socket, state: _Connection) -> None:
        try:
            data = conn.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        state.buffer += data
        try:
            while (body := state.next_frame()) is not None:
                conn.setblocking(True)  # a one-byte answer; the peer waits for it
                conn.sendall(bytes([self._answer(state, body)]))
                conn.setblocking(False)
        except StreamError as e:
            logger.warning("KV event stream refused: %s", e)
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.sendall(bytes([REFUSED]))
            self._drop(conn)
        except OSError:
            self._drop(conn)

    def _answer(self, state: _Connection, body: bytes) -> int:
        if state.replica_id is None:
            token = body[1 : 1 + TOKEN_BYTES]
            if body[0] != HELLO or not secrets.compare_digest(token, self.token):
                raise StreamError("a connection without the shard's token")
            state.replica_id = body[1 + TOKEN_BYTES :].decode("utf-8", "surrogatepass")
            return APPLIED
        if body[0] != BATCHES:
            raise StreamError(f"frame kind {body[0]} after the hello")
        reply = self._publish(state.replica_id, decode_batches(memoryview(body)[1:]))
        return RESYNC if reply.resync else APPLIED

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        conn.close()


class _Connection:
    """One replica's connection: bytes received and not yet framed, and who it is."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.replica_id: str | None = None

    def next_frame(self) -> bytes | None:
        """The next complete frame's body, taken off the buffer; None until one is whole."""
        if len(self.buffer) < _LEN.size:
            return None
        (size,) = _LEN.unpack_from(self.buffer, 0)
        if not 0 < size <= MAX_FRAME_BYTES:
            raise StreamError(f"a frame of {size} bytes")
        end = _LEN.size + size
        if len(self.buffer) < end:
            return None
        body = bytes(self.buffer[_LEN.size : end])
        del self.buffer[:end]
        return body


class StreamClient:
    """A replica's connection to its shard: ``publish`` sends one frame and waits for its
    one-byte answer (the pump has one call in flight, as it had with actor calls)."""

    def __init__(self, endpoint: tuple[str, int, bytes], replica_id: str, timeout_s: float) -> None:
        host, port, token = endpoint
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(encode_hello(token, replica_id))
        self._check(_read_exact(self._sock, 1)[0])

    def publish(self, batches: Sequence[CompactBatch]) -> PublishReply:
        """Send compact batches; the reply as ``KVIndexServer.publish`` answers it."""
        self._sock.sendall(encode_batches(batches))
        reply = _read_exact(self._sock, 1)[0]
        self._check(reply)
        return PublishReply(resync=reply == RESYNC)

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    @staticmethod
    def _check(reply: int) -> None:
        if reply == REFUSED:
            raise ConnectionRefusedError("the index shard refused the KV event stream")
