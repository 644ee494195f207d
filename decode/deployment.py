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
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from core.codec import from_plain, to_plain
from core.messages import DecodeRequest, TokenChunk
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from replica import RoleReplica, WorkerBoot


class DecodeDeployment(RoleReplica[DecodeWorker]):
    """One decode replica: KV import, local prefill when asked, token streaming."""

    role = "decode"

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

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream plain ``TokenChunk`` s; a typed failure ends the stream with a chunk carrying
        its ``ErrorReport`` (the worker's own last chunk)."""
        decode_request = from_plain(DecodeRequest, request)
        self.count_request()
        stream = cast(AsyncGenerator[TokenChunk, None], self.worker.generate(decode_request))
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                yield to_plain(chunk)
