"""Deliberate copies of hot prefixes: when to make one, where, from whom, and when to retire it.

:meth:`PrefixReplicator.consider` runs after a request of a prefix was placed, with the
prefix's heat (``prefix_heat``) and every candidate's predicted seconds for that request
(``hit_minus_load.score_candidates`` — the same numbers the routing decision used). A copy is
made when all of these hold:

1. the prefix is hot: its decayed request rate is at least ``min_copy_rate_per_s``;
2. its holders cannot serve it within the TTFT target: with ``s`` the best holder's uncached
   prefill for this request (a hit's service time) and ``rho = rate * s / holders`` the load
   the prefix alone puts on each holder, either ``rho >= 1`` or the predicted first-token time
   ``s + rho * s / (2 * (1 - rho))`` (the M/D/1 queue) exceeds ``ttft_target_s``, or the best
   holder's predicted time for this request (queue plus uncached prefill) already does;
3. a copy helps: the least loaded replica without the prefix (never one without room) would
   serve it within the target once it holds the blocks (its queue plus ``s``);
4. bounds: fewer than ``max_copies_per_prefix`` deliberate copies, no copy of this prefix still
   landing (a copy lands when the index shows its target holding the blocks; one that has not
   landed within ``copy_interval_s`` is given up), and the copy's bytes fit what is left of
   ``copy_bytes_per_interval`` in the current ``copy_interval_s`` window.

The answer is a :class:`~core.messages.WarmPrefixRequest`: the target pulls the blocks the
source (the holder caching most of the prompt) holds, over the KV transfer. Copies retire when
their prefix's rate falls below ``retire_rate_per_s`` (checked on every call for every copied
prefix, which are few): the router stops counting them, the blocks are left to the replica's
LRU. Counters for ``/metrics`` are read with :meth:`PrefixReplicator.counters`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.routing.hit_minus_load import CandidateSeconds
from cluster.routing.prefix_heat import HeatReading, PrefixHeat
from core.config import HotPrefixConfig
from core.hashing import BlockHash
from core.messages import WarmPrefixRequest


@dataclass(frozen=True)
class CopyCounters:
    """What deliberate replication did so far (``/metrics``, ``pdserve status``)."""

    num_hot_prefixes: int  # prefixes with at least one deliberate copy now
    copies_made_total: int
    copies_dropped_total: int
    copy_bytes_total: int


@dataclass
class _Copy:
    made_s: float
    landed: bool


class PrefixReplicator:
    """Decides deliberate copies of hot prefixes and remembers them until they retire."""

    def __init__(self, config: HotPrefixConfig, pool: str) -> None:
        self.config = config
        self.pool = pool
        self._copies: dict[BlockHash, dict[str, _Copy]] = {}
        self._window_start_s: float | None = None
        self._window_bytes = 0
        self._made = 0
        self._dropped = 0
        self._bytes = 0

    def copies_of(self, head: BlockHash) -> frozenset[str]:
        """The replicas holding a deliberate copy of ``head`` (landed or not)."""
        return frozenset(self._copies.get(head, {}))

    def consider(
        self,
        reading: HeatReading,
        block_hashes: Sequence[BlockHash],
        scores: Sequence[CandidateSeconds],
        now_s: float,
        block_bytes: int,
    ) -> WarmPrefixRequest | None:
        """A copy to make now for this request's prefix, or None (see the module docstring)."""
        cfg = self.config
        copies = self._copies.get(reading.head, {})
        self._note_landed(copies, scores, now_s)
        if not copies:
            self._copies.pop(reading.head, None)
        if reading.rate_per_s < cfg.min_copy_rate_per_s or not block_hashes:
            return None
        if len(copies) >= cfg.max_copies_per_prefix or any(not c.landed for c in copies.values()):
            return None
        holders = [s for s in scores if s.num_hit_blocks > 0]
        if not holders:
            return None  # nothing to copy from: the first request computes it
        best = min(holders, key=lambda s: s.cost_s)
        if not self._holders_too_slow(reading, best, len(holders)):
            return None
        others = [s for s in scores if s.num_hit_blocks == 0 and s.no_room_s == 0.0]
        if not others:
            return None
        target = min(others, key=lambda s: s.queue_s)
        if target.queue_s + best.prefill_s > cfg.ttft_target_s:
            return None
        source = max(holders, key=lambda s: (s.num_hit_blocks, -s.queue_s))
        blocks = tuple(block_hashes[: source.num_hit_blocks])
        num_bytes = len(blocks) * block_bytes
        if not self._spend(num_bytes, now_s):
            return None
        self._copies.setdefault(reading.head, {})[target.replica_id] = _Copy(now_s, landed=False)
        self._made += 1
        self._bytes += num_bytes
        return WarmPrefixRequest(
            pool=self.pool,
            prefix_head=reading.head,
            block_hashes=blocks,
            source_replica_id=source.replica_id,
            target_replica_id=target.replica_id,
            num_bytes=num_bytes,
        )

    def _holders_too_slow(
        self, reading: HeatReading, best: CandidateSeconds, num_holders: int
    ) -> bool:
        """Rule 2 of the module docstring."""
        target_s = self.config.ttft_target_s
        if best.cost_s > target_s:
            return True
        service_s = best.prefill_s
        rho = reading.rate_per_s * service_s / num_holders
        if rho >= 1.0:
            return True
        return service_s + rho * service_s / (2.0 * (1.0 - rho)) > target_s

    def retire(self, heat: PrefixHeat, now_s: float) -> int:
        """Retire the copies of prefixes that cooled down; returns how many were dropped."""
        num_dropped = 0
        for head in list(self._copies):
            if heat.reading(head, now_s).rate_per_s < self.config.retire_rate_per_s:
                num_dropped += len(self._copies.pop(head))
        self._dropped += num_dropped
        return num_dropped

    def forget_replica(self, replica_id: str) -> None:
        """``replica_id`` left the pool: its copies are gone (counted as dropped)."""
        for head in list(self._copies):
            if self._copies[head].pop(replica_id, None) is not None:
                self._dropped += 1
            if not self._copies[head]:
                del self._copies[head]

    def give_up(self, head: BlockHash, replica_id: str) -> bool:
        """The copy of ``head`` to ``replica_id`` failed: forget it, counted as dropped;
        False when there is no such copy (already retired or forgotten)."""
        copies = self._copies.get(head, {})
        if copies.pop(replica_id, None) is None:
            return False
        if not copies:
            self._copies.pop(head, None)
        self._dropped += 1
        return True

    def counters(self) -> CopyCounters:
        """The counters now."""
        return CopyCounters(len(self._copies), self._made, self._dropped, self._bytes)

    def _note_landed(
        self, copies: dict[str, _Copy], scores: Sequence[CandidateSeconds], now_s: float
    ) -> None:
        holding = {s.replica_id for s in scores if s.num_hit_blocks > 0}
        for replica_id, copy in list(copies.items()):
            if replica_id in holding:
                copy.landed = True
            elif not copy.landed and now_s - copy.made_s > self.config.copy_interval_s:
                del copies[replica_id]  # never landed: given up, the slot is free again
                self._dropped += 1

    def _spend(self, num_bytes: int, now_s: float) -> bool:
        cfg = self.config
        if self._window_start_s is None or now_s - self._window_start_s >= cfg.copy_interval_s:
            self._window_start_s, self._window_bytes = now_s, 0
        if self._window_bytes + num_bytes > cfg.copy_bytes_per_interval:
            return False
        self._window_bytes += num_bytes
        return True
