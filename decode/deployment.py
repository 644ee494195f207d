"""The ``Decode`` Ray Serve deployment: one replica runs one :class:`DecodeWorker`.

Plain class on the shared replica boot (:class:`~replica.lifecycle.RoleReplica`); ``cluster.
serve.app_builder`` applies the pool's options and binds its ``ReplicaSpec`` and hooks.
``generate`` is a Serve streaming generator (callers use ``handle.options(stream=True)``): it
takes a plain ``DecodeRequest`` and yields one plain ``TokenChunk`` per engine step (``core.
codec``). When the caller goes away Serve cancels the generator; closing the worker's stream then
aborts the request, cancels its KV pull and frees its blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, cast

from core.codec import from_plain, to_plain
from core.messages import DecodeRequest, PrefixExport, TokenChunk
from core.stats import ReplicaStats
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from replica import RoleReplica, WorkerBoot

logger = logging.getLogger(__name__)


class DecodeDeployment(RoleReplica[DecodeWorker]):
    """One decode replica: KV import, local prefill when asked, token streaming."""

    role = "decode"
    _handoff_blocks_pulled = 0  # blocks pulled for handed-off requests (counted per instance)

    def build_worker(self, boot: WorkerBoot) -> DecodeWorker:
        """The engine (or the gang rank's) plus an import-only KV transport."""
        return build_decode_worker(
            boot.spec.model,
            boot.spec.engine,
            boot.transfer,
            kv_failure_policy=boot.spec.kv_failure_policy,
            kv_event_callback=boot.kv_event_callback,
            async_engine=boot.engine,
        )

    def hand_off_handler(self) -> Callable[[], Awaitable[int]]:
        """The cluster takes this pool away: hand the requests decoding here off."""
        return self.hand_off

    async def hand_off(self) -> int:
        """Stop each request decoding here and end its stream with its blocks exported
        (``DecodeWorker.hand_off``); how many were."""
        return await self.worker.hand_off(self.prefix_copies().exporter)

    def replica_stats(self) -> ReplicaStats:
        """The shared stats, with the blocks pulled for handed-off requests."""
        return dataclasses.replace(
            super().replica_stats(), handoff_blocks_pulled_total=self._handoff_blocks_pulled
        )

    def drain_timeout_s(self) -> float:
        """A handed-off request's export not pulled within its lease has expired anyway."""
        return self.spec.transfer.lease_s

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream plain ``TokenChunk`` s; a typed failure ends the stream with a chunk carrying
        its ``ErrorReport`` (the worker's own last chunk). A handed-off request first pulls the
        blocks its last replica exported (``DecodeRequest.warm_from``)."""
        decode_request = from_plain(DecodeRequest, request)
        self.count_request()
        if decode_request.warm_from is not None:
            await self._pull_handed_off(decode_request, decode_request.warm_from)
        stream = cast(AsyncGenerator[TokenChunk, None], self.worker.generate(decode_request))
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                yield to_plain(chunk)

    async def _pull_handed_off(self, request: DecodeRequest, export: PrefixExport) -> None:
        """Pull a handed-off request's blocks into this replica's cache; a failed pull only
        leaves more to recompute (logged)."""
        result = await self.prefix_copies().pull_handed_off(export)
        self._handoff_blocks_pulled += result.num_blocks_admitted
        logger.info(
            "request %s: pulled %d of %d handed-off blocks%s",
            request.request_id,
            result.num_blocks_admitted,
            result.num_blocks_requested,
            "" if result.failure is None else f" ({result.failure})",
        )
