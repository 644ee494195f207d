"""The target's :class:`~replica.prefix_warming.PrefixBlockSource` over the KV transfer: pull a
hot prefix's exported blocks (a :class:`~core.messages.PrefixExport`) into a scratch store and
hand their bytes on for the host tier.

The blocks are not for a request, so they never occupy the engine's device pool: each pull gets
a private :class:`~transfer.block_store.NumpyBlockStore` of the export's size under this
engine's KV layout and a transport over it made by ``make_transport`` (the replica's gRPC
import settings, or an in-process transport in tests), which chooses the path as any pull does
(same-node shared memory or the wire). The transport is closed after the pull; a completed pull
frees the export on the holder, a failed one has released it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import torch

from core.errors import TransferError
from core.kv_handle import TransferFailure, TransferState
from core.kv_layout import KVLayout
from core.messages import PrefixExport, WarmPrefixRequest
from replica.prefix_warming import PulledBlocks
from transfer import KVTransport
from transfer.block_store import BlockStore, NumpyBlockStore

logger = logging.getLogger(__name__)

TransportFactory = Callable[[BlockStore], KVTransport]
"""A transport that pulls into the given store (import only)."""


class TransportPrefixSource:
    """Pulls exported prefixes over a transport made for each pull."""

    def __init__(
        self, layout: KVLayout, make_transport: TransportFactory, *, timeout_s: float
    ) -> None:
        self.layout = layout
        self._make_transport = make_transport
        self.timeout_s = timeout_s

    async def pull(self, request: WarmPrefixRequest, export: PrefixExport) -> PulledBlocks:
        """Every block of ``export``; ``TransferError`` when the pull fails or times out."""
        num_blocks = export.handle.num_blocks
        store = NumpyBlockStore(self.layout, num_blocks)  # [num_blocks, block_bytes] uint8
        transport = self._make_transport(store)
        try:
            task = transport.pull(export.handle, list(range(num_blocks)))
            try:
                status = await asyncio.wait_for(
                    asyncio.wrap_future(task.as_future()), self.timeout_s
                )
            except TimeoutError as e:
                task.cancel()
                raise TransferError(
                    f"pulling prefix {request.prefix_head} took over {self.timeout_s:g}s",
                    reason=TransferFailure.DEADLINE_EXCEEDED,
                ) from e
        finally:
            await asyncio.to_thread(transport.close)
        if status.state is not TransferState.DONE:
            raise TransferError(
                f"pulling prefix {request.prefix_head}: {status.message}",
                reason=status.reason or TransferFailure.INTERNAL,
            )
        payloads = tuple(torch.from_numpy(store.data[i].copy()) for i in range(num_blocks))
        return PulledBlocks(export.block_hashes, payloads)
