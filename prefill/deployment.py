"""The ``Prefill`` Ray Serve deployment: one replica runs one :class:`PrefillWorker`.

Plain class on the shared replica boot (:class:`~replica.lifecycle.RoleReplica`); ``cluster.
serve.app_builder`` turns it into a deployment with the pool's options and binds its
``ReplicaSpec`` (as plain data) and hooks, so no constants are baked in here. Across the Serve
boundary everything is plain data through ``core.codec``: a request is a ``PrefillRequest``; the
reply a ``PrefillReply`` holding the ``PrefillResult`` or, on a typed failure, the
``ErrorReport`` the caller turns back into the same ``core.errors`` class.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from core.codec import from_plain, to_plain
from core.errors import PdserveError
from core.messages import PrefillReply, PrefillRequest, PrefillStarted
from core.transfer_faults import FaultInjection
from prefill.build import build_prefill_worker
from prefill.worker import PrefillWorker
from replica import RoleReplica, WorkerBoot


class PrefillDeployment(RoleReplica[PrefillWorker]):
    """One prefill replica: the engine in prefill mode plus its KV export server."""

    role = "prefill"

    def build_worker(self, boot: WorkerBoot) -> PrefillWorker:
        """The engine (or the gang rank's) plus a KV export server on this node."""
        return build_prefill_worker(
            boot.spec.model,
            boot.spec.engine,
            boot.transfer,
            node_host=boot.node_host,
            kv_event_callback=boot.kv_event_callback,
            async_engine=boot.engine,
        )

    def fault_handler(self) -> Callable[[FaultInjection], None]:
        """Injected transfer faults break this replica's exports."""
        return self.worker.set_faults

    def drain_timeout_s(self) -> float:
        """An export not pulled within its lease has expired anyway."""
        return self.spec.transfer.lease_s

    async def prefill_stream(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The pipelined prefill (a Serve streaming method): a plain ``PrefillStarted``, then a
        plain ``PrefillReply`` (only the reply when it fails first). Serve closes this
        generator when the caller goes away, which aborts the prefill and frees its export."""
        self.count_request()
        prefill_request = from_plain(PrefillRequest, request)
        updates = self.worker.prefill_stream(prefill_request)
        try:
            async with contextlib.aclosing(updates):
                async for update in updates:
                    if isinstance(update, PrefillStarted):
                        yield to_plain(update)
                    else:
                        yield to_plain(PrefillReply(result=update))
        except PdserveError as e:
            yield to_plain(PrefillReply(error=self.report_failure(prefill_request.request_id, e)))

    async def prefill(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one prompt (a plain ``PrefillRequest``); a plain ``PrefillReply``."""
        self.count_request()
        prefill_request = from_plain(PrefillRequest, request)
        try:
            reply = PrefillReply(result=await self.worker.prefill(prefill_request))
        except PdserveError as e:
            reply = PrefillReply(error=self.report_failure(prefill_request.request_id, e))
        plain: dict[str, Any] = to_plain(reply)
        return plain
