"""Asking a decode replica Serve is stopping to hand its streams off.

Serve stops a replica (a scale-down, a rollout step that keeps its pool) by taking it out of
every router's set and waiting up to the pool's ``graceful_shutdown_timeout_s`` for its requests
before killing it; a stream longer than that is cut and recomputed elsewhere. The ingress sees
the replica leave its routers (``cluster.routing.routed_replicas.has_left``) while the replica
still reports streams to the board, so it asks the board to have it hand them off now
(``StatsBoard.hand_off_replica``): each continues on a replica of its pool that pulls the
blocks instead of recomputing them, and the leaving one empties in a moment.

Asked again every ``reask_s`` while the replica still reports running requests (a request
already on its way when the replica left arrives after the first handoff). Not asked when no
live replica of the pool has the leaving one's KV fingerprint: the streams would be recomputed
under other weights (a rollout's other version) and mix two versions' tokens, so they finish
where they are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from cluster.routing import routed_replicas
from core.stats import ReplicaReport

logger = logging.getLogger(__name__)

AskFn = Callable[[str], Awaitable[object]]


class LeavingDecodes:
    """Which leaving decode replicas to ask for a handoff, and when they were last asked."""

    def __init__(
        self, ask: AskFn, reask_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ask = ask
        self._reask_s = reask_s
        self._clock = clock
        self._asked_s: dict[str, float] = {}
        self._failed: set[str] = set()  # replicas whose ask failed (logged once)
        self.asked_total = 0
        """Handoffs asked of leaving replicas."""

    async def check(
        self,
        reports: Mapping[str, Sequence[ReplicaReport]],
        live_fingerprints: Mapping[str, Mapping[str, int]],
    ) -> None:
        """Ask each decode replica of ``reports`` (the board's, by pool) that left its routers
        and still runs requests, while its pool has a live replica of its KV fingerprint
        (``live_fingerprints``: pool -> fingerprint -> live replicas)."""
        now_s = self._clock()
        reporting: set[str] = set()
        for pool, replicas in reports.items():
            for r in replicas:
                reporting.add(r.replica_id)
                if r.role != "decode" or r.stats.num_running == 0:
                    continue
                if not live_fingerprints.get(pool, {}).get(r.stats.kv_fingerprint):
                    continue
                deployment = routed_replicas.deployment_of(r.actor_name)
                if not routed_replicas.has_left(deployment, r.replica_id):
                    continue
                asked_s = self._asked_s.get(r.replica_id)
                if asked_s is not None and now_s - asked_s < self._reask_s:
                    continue
                self._asked_s[r.replica_id] = now_s
                try:
                    await self._ask(r.replica_id)
                except Exception as e:  # the board restarting: its streams drain as before
                    log = logger.debug if r.replica_id in self._failed else logger.warning
                    self._failed.add(r.replica_id)  # a board of an earlier pdserve fails each
                    log("asking leaving replica %s to hand off: %s", r.replica_id, e)
                    continue
                self.asked_total += 1
                logger.info(
                    "decode replica %s left its routers with %d requests running: handoff asked",
                    r.replica_id,
                    r.stats.num_running,
                )
        for replica_id in [k for k in self._asked_s if k not in reporting]:
            del self._asked_s[replica_id]  # gone from the board: stopped
            self._failed.discard(replica_id)
