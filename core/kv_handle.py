"""The KV handoff control message and the progress of one KV transfer.

A prefill worker that keeps a prompt's blocks pinned under a lease returns a :class:`KVHandle`
with the first token; the decode worker pulls the blocks the handle names (ARCHITECTURE §3).
The handle holds plain strings and ints only, so it crosses process boundaries as any control
message does (``core.codec``). An import reports its progress as a :class:`TransferStatus`: a
:class:`TransferState` plus, once FAILED, a :class:`TransferFailure` reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from core.kv_compat import KVCompat


@dataclass(frozen=True)
class KVHandle:
    """Where and how to pull one exported run of KV blocks."""

    transfer_id: str
    """Unguessable id of the export (``core.ids.new_transfer_id``)."""
    address: str
    """``host:port`` of the exporter's gRPC server (``inproc://...`` for the in-process one)."""
    num_blocks: int
    """Blocks in the export; a pull names the ones it wants by index in ``range(num_blocks)``."""
    block_bytes: int
    """Bytes of one block (``KVLayout.block_bytes``)."""
    layout_fingerprint: str
    """``KVLayout.fingerprint()`` of the exporter; the importer's must be equal."""
    lease_deadline_unix_ms: int
    """Wall-clock time (ms since the Unix epoch) the export is freed unless pulled or extended."""
    exporter_epoch: str
    """Random id of the exporter's lifetime; differs after the exporter restarts."""
    pipelined: bool = False
    """The export was opened before its prompt was computed: blocks become ready in prompt order
    as the prefill computes them, and the importer learns the prefill's first token (an
    :class:`ExportDone`) from the exporter once it finished."""
    node_id: str = ""
    """The exporter's node (host name and boot id): an importer with the same one may read the
    blocks from ``shared_region`` instead of the wire."""
    shared_region: str = ""
    """The named shared-memory segment holding the exporter's KV bytes; empty: none."""
    device_region: str = ""
    """The exporter's device KV, shareable with processes on ``node_id`` (a CUDA IPC
    descriptor, ``engine.kv.cuda_ipc``); empty: none. An importer there may copy the blocks
    device to device (``transfer.device_path``)."""
    tp_size: int = 1
    """Tensor-parallel ranks of the exporter: above 1, every rank holds its share of the KV
    heads and an importer pulls each head from a rank holding it
    (:func:`core.tensor_parallel.plan_kv_pieces`); ``layout_fingerprint`` is then that of the
    unsplit layout (``KVLayout.unsplit``)."""
    kv_compat: KVCompat | None = None
    """What makes the exporter's KV reusable (model revision, layout, ...): an importer pulls
    only from an exporter whose compatibility equals its own. None: the exporter declares none."""


@dataclass(frozen=True)
class ExportDone:
    """What a pipelined export's prefill ended with: the token it sampled after the prompt and
    where its prompt chunks ended (a recompute on the decode side follows them)."""

    first_token_id: int
    prompt_chunk_ends: tuple[int, ...] = ()


class TransferState(enum.Enum):
    """Lifecycle of one import: PENDING -> TRANSFERRING -> DONE | FAILED."""

    PENDING = "pending"
    TRANSFERRING = "transferring"
    DONE = "done"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        """True for DONE and FAILED: the state never changes again."""
        return self in (TransferState.DONE, TransferState.FAILED)


class TransferFailure(enum.StrEnum):
    """Why a transfer FAILED: a short machine-readable tag (``TransferError.reason``)."""

    EXPORTER_UNAVAILABLE = "exporter_unavailable"
    """The exporter is unreachable, died or shut down mid-stream, or refused the TLS handshake."""
    EXPORTER_ERROR = "exporter_error"
    """The exporter aborted the stream (an internal error or an injected fault)."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """The pull did not finish within its deadline."""
    CORRUPT_CHUNK = "corrupt_chunk"
    """A chunk's CRC-32 does not match its payload."""
    BAD_CHUNK = "bad_chunk"
    """A chunk has the wrong offset or size, or the stream ended early."""
    UNKNOWN_TRANSFER = "unknown_transfer"
    """The exporter does not know the transfer id (never exported, released or completed)."""
    LEASE_EXPIRED = "lease_expired"
    """The export's lease expired before the pull."""
    PEER_RESTARTED = "peer_restarted"
    """The exporter restarted since the handle was issued (its epoch differs)."""
    LAYOUT_MISMATCH = "layout_mismatch"
    """Exporter and importer KV layouts differ."""
    KV_INCOMPATIBLE = "kv_incompatible"
    """Exporter and importer KV compatibility differs (model revision, hash seed, speculative
    settings, protocol or KV format: ``core.kv_compat``): the blocks would be read wrong."""
    ALREADY_PULLING = "already_pulling"
    """Another pull of the same export is running."""
    UNAUTHENTICATED = "unauthenticated"
    """The exporter rejected the auth token."""
    INVALID_REQUEST = "invalid_request"
    """Block indices out of range or repeated, or destination blocks that do not fit."""
    CANCELLED = "cancelled"
    """The importer cancelled the transfer or shut down."""
    NOT_READY = "not_ready"
    """A pull asked for blocks a pipelined export has not computed yet."""
    INTERNAL = "internal"
    """An unexpected error in the transfer layer itself."""


@dataclass(frozen=True)
class TransferStatus:
    """A snapshot of one import's progress."""

    transfer_id: str
    state: TransferState
    bytes_done: int
    bytes_total: int
    reason: TransferFailure | None = None
    """Set exactly when ``state`` is FAILED."""
    message: str = ""
    """Human-readable detail of a failure."""
    invalid_block_ids: tuple[int, ...] = ()
    """Destination blocks that do not hold the pulled data (set when FAILED)."""
