"""The :class:`~cluster.routing.prefix_copy_delivery.ReplicaCaller` over Ray Serve: a handle to
the router's own deployment whose calls carry ``routing.replica_id``, so the pool's request
router (``serve_router``) sends each to the one replica it names — the same routing keys every
request carries, no replica actor addressed by hand.

Every call runs in a worker thread, handle and all: the copies are started from the request
router, i.e. on Serve's router event loop, and a handle's first call builds its router by
waiting on that very loop (``Router.__init__`` blocks on a coroutine it schedules there), so a
call made on the loop would freeze it — and with it every request of the process. In a thread
the call blocks only that thread, for at most ``timeout_s``. The calls go through a router of
their own in this process, which ranks only the named replica and records no load or heat for
them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from core.codec import from_plain, to_plain
from core.messages import PrefixCopyCall, PrefixExport, RoutingKeys, WarmPrefixRequest
from replica.prefix_warming import WarmPrefixResult

HandleFactory = Callable[[str, str], DeploymentHandle]
"""``(deployment_name, app_name) -> handle`` (``serve.get_deployment_handle``; fakes in tests)."""


class ServeReplicaCaller:
    """Calls ``export_prefix`` / ``warm_prefix`` on named replicas of one deployment."""

    def __init__(
        self,
        deployment_name: str,
        app_name: str,
        *,
        timeout_s: float,
        get_handle: HandleFactory = serve.get_deployment_handle,
    ) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.timeout_s = timeout_s
        self._get_handle = get_handle
        self._handle: DeploymentHandle | None = None
        self._lock = threading.Lock()  # the handle is made once, by whichever thread is first

    async def export_prefix(self, request: WarmPrefixRequest) -> PrefixExport | None:
        """The holder's export (None: it caches not even the first block)."""
        call = PrefixCopyCall(request, RoutingKeys(replica_id=request.source_replica_id))
        plain = await self._call("export_prefix", call)
        return None if plain is None else from_plain(PrefixExport, plain)

    async def warm_prefix(
        self, request: WarmPrefixRequest, export: PrefixExport
    ) -> WarmPrefixResult:
        """The target's pull of ``export``."""
        call = PrefixCopyCall(request, RoutingKeys(replica_id=request.target_replica_id), export)
        return from_plain(WarmPrefixResult, await self._call("warm_prefix", call))

    async def _call(self, method: str, call: PrefixCopyCall) -> Any:
        return await asyncio.to_thread(self._call_blocking, method, to_plain(call))

    def _call_blocking(self, method: str, plain: Any) -> Any:
        """In a worker thread: the call's result, or Serve's error (``TimeoutError`` past
        ``timeout_s``)."""
        with self._lock:
            if self._handle is None:
                self._handle = self._get_handle(self.deployment_name, self.app_name)
            handle = self._handle
        return getattr(handle, method).remote(plain).result(timeout_s=self.timeout_s)
