"""The cluster side of ``/admin/faults`` (``cluster.ingress.app.fault_routes``): kill a replica
with Ray, or post transfer faults to the stats board, which hands them to every prefill
replica with its next report answer (``cluster.serve.stats_board``)."""

from __future__ import annotations

import logging

import ray
from ray.serve.handle import DeploymentHandle

from cluster.serve.stats_board import decode_reports
from core.codec import to_plain
from core.config import split_pool_key
from core.errors import UnavailableError
from core.transfer_faults import FaultInjection

logger = logging.getLogger(__name__)


class ServeFaultAdmin:
    """Injects faults into the app whose stats board is ``board``."""

    def __init__(self, board: DeploymentHandle) -> None:
        self._board = board

    async def kill_replica(self, pool: str) -> str:
        """Kill the live ``pool`` replica running the most requests, of any model (no
        restart: Serve starts a replacement); its replica id."""
        by_pool = decode_reports(await self._board.snapshot.remote())
        reports = [r for key, rs in by_pool.items() if split_pool_key(key)[0] == pool for r in rs]
        live = [r for r in reports if r.actor_name]
        if not live:
            raise UnavailableError(f"no live {pool} replica to kill")
        victim = max(live, key=lambda r: r.stats.num_running)
        logger.warning("fault injection: killing %s replica %s", pool, victim.replica_id)
        ray.kill(ray.get_actor(victim.actor_name, namespace="serve"), no_restart=True)
        return f"killed {pool} replica {victim.replica_id}"

    async def transfer_faults(self, fail: bool, stall_per_chunk_s: float, duration_s: float) -> str:
        """Prefill exports abort at their first chunk (``fail``) or stall per chunk, for
        ``duration_s``."""
        faults = (
            FaultInjection(fail_after_chunks=0)
            if fail
            else FaultInjection(delay_per_chunk_s=stall_per_chunk_s)
        )
        await self._board.set_faults.remote("prefill", to_plain(faults), duration_s)
        logger.warning("fault injection: %s on prefill exports for %.1f s", faults, duration_s)
        return f"{'fail' if fail else 'stall'} prefill exports for {duration_s:g} s"

    async def clear_transfer_faults(self) -> str:
        """The prefill replicas stop injecting with their next report."""
        await self._board.set_faults.remote("prefill", to_plain(FaultInjection()), 0.0)
        logger.warning("fault injection: prefill exports back to normal")
        return "prefill exports back to normal"
