"""A replica's side of a deliberate hot-prefix copy: take a router's ``WarmPrefixRequest``,
pull the prefix's blocks from the replica holding them, and admit them into this engine's host
tier ahead of the requests (which then onload them as host hits, never recomputing them).

The router first asks the source replica to export the blocks (``replica.prefix_export``: a
:class:`~core.messages.PrefixExport`), then hands request and export to the target. Two seams,
each a ``Protocol``: :class:`PrefixBlockSource` pulls the blocks (over the KV transfer from the
export, ``replica.prefix_pull``; in tests, in memory) and :class:`PrefixAdmitter` hands them
to the engine (``LLMEngine.admit_prefix`` on the engine thread, ``replica.prefix_admit``).
:class:`PrefixWarmer` checks the request is for this replica, runs the two and reports a
:class:`WarmPrefixResult`; a failed pull is a result with its reason, not an exception: the
router counts the copy dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from core.errors import MessageError, TransferError
from core.hashing import BlockHash
from core.messages import PrefixExport, WarmPrefixRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PulledBlocks:
    """A leading run of a prefix's blocks as the source held them."""

    block_hashes: tuple[BlockHash, ...]
    payloads: tuple[torch.Tensor, ...]  # each [block_bytes] uint8, as the KV layout stores it


@dataclass(frozen=True)
class WarmPrefixResult:
    """What one warm-prefix request came to on this replica."""

    num_blocks_requested: int
    num_blocks_admitted: int = 0
    num_bytes: int = 0
    failure: str | None = None  # why nothing (or less) was admitted; None: all of it


class PrefixBlockSource(Protocol):
    """Pulls a prefix's blocks from the replica that holds them."""

    async def pull(self, request: WarmPrefixRequest, export: PrefixExport) -> PulledBlocks:
        """The blocks of ``export`` (the leading run of ``request.block_hashes`` that
        ``request.source_replica_id`` still held); raises ``TransferError`` when the pull
        fails."""
        ...


class PrefixAdmitter(Protocol):
    """Puts pulled blocks where this engine's requests find them."""

    async def admit(self, blocks: PulledBlocks) -> int:
        """Admit a leading run of ``blocks`` (on the engine thread); returns how many."""
        ...


class PrefixWarmer:
    """Handles ``WarmPrefixRequest``s addressed to one replica."""

    def __init__(
        self, replica_id: str, pool: str, source: PrefixBlockSource, admitter: PrefixAdmitter
    ) -> None:
        self.replica_id = replica_id
        self.pool = pool
        self._source = source
        self._admitter = admitter

    async def warm(self, request: WarmPrefixRequest, export: PrefixExport) -> WarmPrefixResult:
        """Pull and admit the request's blocks (see the module docstring)."""
        if request.target_replica_id != self.replica_id or request.pool != self.pool:
            raise MessageError(
                f"warm-prefix request for replica {request.target_replica_id} of pool "
                f"{request.pool!r} reached replica {self.replica_id} of pool {self.pool!r}"
            )
        requested = len(request.block_hashes)
        try:
            pulled = await self._source.pull(request, export)
        except TransferError as e:
            logger.warning(
                "warm prefix %s from %s failed: %s",
                request.prefix_head,
                request.source_replica_id,
                e,
            )
            return WarmPrefixResult(requested, failure=f"pull failed: {e}")
        if pulled.block_hashes != request.block_hashes[: len(pulled.block_hashes)]:
            return WarmPrefixResult(requested, failure="the source sent blocks of another prefix")
        num_admitted = await self._admitter.admit(pulled)
        num_bytes = sum(int(p.numel()) for p in pulled.payloads[:num_admitted])
        failure = None
        if num_admitted < requested:
            failure = (
                f"{len(pulled.block_hashes)} of {requested} blocks pulled, {num_admitted} admitted"
            )
        return WarmPrefixResult(requested, num_admitted, num_bytes, failure)
