"""The :class:`~cluster.routing.prefix_copy_delivery.ReplicaCaller` over Ray Serve: a handle to
the router's own deployment whose calls carry ``routing.replica_id``, so the pool's request
router (``serve_router``) sends each to the one replica it names — the same routing keys every
request carries, no replica actor addressed by hand.

The handle is made on first use, off the event loop (looking a deployment up asks Serve's
controller). Its calls go through a router of their own in this process, which ranks only the
named replica and records no load or heat for them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from core.codec import from_plain, to_plain
from core.messages import PrefixCopyCall, PrefixExport, RoutingKeys, WarmPrefixRequest
from replica.prefix_warming import WarmPrefixResult


class ServeReplicaCaller:
    """Calls ``export_prefix`` / ``warm_prefix`` on named replicas of one deployment."""

    def __init__(self, deployment_name: str, app_name: str) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self._handle: DeploymentHandle | None = None

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
        if self._handle is None:
            self._handle = await asyncio.to_thread(
                serve.get_deployment_handle, self.deployment_name, self.app_name
            )
        return await getattr(self._handle, method).remote(to_plain(call))
