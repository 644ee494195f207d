"""A router's hot-prefix bookkeeping: heat fed by the requests it places, deliberate copies.

:class:`HotPrefixes` is what a ``hot_prefix`` router (and ``benchmarks/hot_prefix.py``, on a
simulated pool) calls around each decision: :meth:`HotPrefixes.placed` after a request was
ranked (records its prefix's heat; for a hot prefix, scores the candidates in seconds and asks
the :class:`~cluster.routing.prefix_replication.PrefixReplicator` for a copy), and
:meth:`HotPrefixes.finished` when it ended. Copies to make wait in :meth:`take_warm_requests`
for whoever delivers them to their target replica. Prefixes below ``min_copy_rate_per_s`` cost
one heat update per request and nothing else.
"""

from __future__ import annotations

from cluster.routing.hit_minus_load import score_candidates
from cluster.routing.policy_types import RoutingInputs
from cluster.routing.prefix_heat import PrefixHeat, prefix_head
from cluster.routing.prefix_replication import CopyCounters, PrefixReplicator
from core.config import HotPrefixConfig
from core.messages import WarmPrefixRequest

MAX_PENDING_WARM_REQUESTS = 64
"""Copies decided and not yet taken for delivery; older ones are dropped first."""


class HotPrefixes:
    """Heat per prefix head and the deliberate copies it leads to, for one pool's router."""

    def __init__(self, config: HotPrefixConfig, pool: str) -> None:
        self.config = config
        self.heat = PrefixHeat(
            half_life_s=config.heat_half_life_s, max_prefixes=config.max_tracked_prefixes
        )
        self.replicator = PrefixReplicator(config, pool)
        self._pending: list[WarmPrefixRequest] = []

    def placed(
        self,
        request_id: str,
        inputs: RoutingInputs,
        num_work_tokens: int,
        now_s: float,
        block_bytes: int,
    ) -> WarmPrefixRequest | None:
        """Record a placed request's heat; returns the copy its prefix needs now, if any (also
        kept for :meth:`take_warm_requests`)."""
        self.replicator.retire(self.heat, now_s)
        head = prefix_head(inputs.block_hashes, self.config.head_blocks)
        if head is None:
            return None
        self.heat.record(request_id, head, num_work_tokens, now_s)
        reading = self.heat.reading(head, now_s)
        if reading.rate_per_s < self.config.min_copy_rate_per_s:
            return None
        scores = score_candidates(inputs, self.config)
        warm = self.replicator.consider(reading, inputs.block_hashes, scores, now_s, block_bytes)
        if warm is not None:
            self._pending.append(warm)
            del self._pending[:-MAX_PENDING_WARM_REQUESTS]
        return warm

    def finished(self, request_id: str) -> None:
        """The request ended: its tokens leave its prefix's queue."""
        self.heat.finish(request_id)

    def forget_replica(self, replica_id: str) -> None:
        """The replica left the pool: its deliberate copies are gone."""
        self.replicator.forget_replica(replica_id)

    def give_up(self, warm: WarmPrefixRequest) -> bool:
        """A delivered copy landed nothing: forget it (counted dropped) so the prefix may be
        copied again; False when it was already gone (retired, or its replica left)."""
        return self.replicator.give_up(warm.prefix_head, warm.target_replica_id)

    def take_warm_requests(self) -> list[WarmPrefixRequest]:
        """The copies decided since the last call, oldest first."""
        pending, self._pending = self._pending, []
        return pending

    def counters(self) -> CopyCounters:
        """Copies made, dropped, bytes and prefixes with copies now."""
        return self.replicator.counters()
