"""Whether two replicas' KV blocks are interchangeable, as one fingerprint.

A KV block is only reusable by another replica when everything that produced its bytes and names
it agrees: the model's weights (a content hash of the checkpoint, not its name — a rolling
upgrade may serve two revisions under one name), the block layout (block size, KV dtype and
heads, the block-hash algorithm: ``KVLayout.unsplit().fingerprint()``, so tensor-parallel splits
of any size agree), the block-hash seed, the speculative/draft settings, the transfer protocol
and pdserve's KV format. :class:`KVCompat` holds them; its :meth:`~KVCompat.fingerprint` is what
a transfer handshake compares and what replica stats publish, and :meth:`~KVCompat.differences`
names what differs when two do not match.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

KV_FORMAT_VERSION = 1
"""pdserve's KV block byte format (rows, scales, order); bump on any change to it."""

TRANSFER_PROTOCOL = "pdserve.kv.v1"
"""The KV transfer's wire protocol: the protobuf package of ``transfer/proto``."""


@dataclass(frozen=True)
class KVCompat:
    """Everything two replicas must share for one to use the other's KV blocks."""

    model_revision: str
    """Content hash of the checkpoint's weights and config (``engine.checkpoint.revision``)."""
    layout: str
    """``KVLayout.unsplit().fingerprint()``: block size, dtype, heads, block-hash algorithm."""
    hash_seed: int = 0
    """The engines' block-hash seed (``engine.hash_seed``)."""
    speculative: str = ""
    """The speculative-decoding settings that change what a replica keeps in KV ("" none)."""
    transfer_protocol: str = TRANSFER_PROTOCOL
    kv_format: int = KV_FORMAT_VERSION

    def fingerprint(self) -> str:
        """A short stable digest of every field (16 hex digits)."""
        text = "|".join(f"{k}={v}" for k, v in sorted(asdict(self).items()))
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def differences(self, other: KVCompat) -> list[str]:
        """``field: mine != theirs`` for each field that differs (empty: compatible)."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]
