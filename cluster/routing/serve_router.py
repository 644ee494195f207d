"""Ray Serve request routers for the Prefill and Decode deployments.

Serve builds one router per deployment handle inside the caller's process (the ingress) and
calls :meth:`PdserveRequestRouter.choose_replicas` for every request; the returned ranks are
one replica each, best first, so Serve sends to the first one that accepts.

Per decision, synchronously and without I/O (nothing here awaits, so the ingress event loop is
never blocked): read the request's ``routing`` keys (``request_features``: block hashes, prompt
length, session id — computed once by the ingress), match the hashes against the local index
follower (``kv_index.follower``), describe each candidate
(:class:`~cluster.routing.load_tracker.LoadTracker` for what this router sent and has not seen
finish, the replica's ``routing_stats`` for waiting requests and KV blocks, Serve's queue
length cache when it has one), run the policy, then record the load, the session pin and the
metrics.

At scale the policy does not score every replica: past ``max_scored_candidates`` (64) it scores
the replicas caching the longest prefixes (up to half of that), the session's pinned replica and
a random sample of the rest (power-of-k choices, as Serve's own router samples two), and ranks
the unscored replicas after them in Serve's order. A decision over a thousand replicas then
costs the index walk plus a fixed amount, not a description of every replica
(``benchmarks/control_plane_scale.py``).

Where the index lives, and why: a named Ray actor fed by the workers' KV event batches; each router
keeps a follower copy that a background task on the router's loop updates from the actor's change
log every ``poll_interval_s`` (see ``kv_index.follower``). ``record_routing_stats`` is used only for
load figures: it is periodic (seconds) and would have to carry every hash.

A call whose routing keys name a replica (``RoutingKeys.replica_id``: a hot-prefix copy's
export or pull, ``prefix_copy_delivery``) goes to that replica alone and is not counted as load.
Under ``hot_prefix`` with ``deliver_copies`` the router hands each copy it decides to a
:class:`~cluster.routing.prefix_copy_delivery.PrefixCopyDelivery` on its own loop and counts
the bytes that moved and the copies that failed when they end.

The policy and the hot-prefix settings come from ``request_router_kwargs`` when Serve builds
the router, and may change under it: an in-place ``pdserve upgrade`` has the ingress publish new
ones for its app (``cluster.routing.live_settings``), which the router takes at its next
decision.

The deployments must define ``record_routing_stats()`` returning ``core.stats.RoutingStats`` as
plain data (``core.codec``); a replica that has not reported yet counts as empty.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from cluster.routing import board_fingerprints, live_settings, routed_replicas
from cluster.routing.hot_prefixes import HotPrefixes
from cluster.routing.kv_index.fingerprints import of_fingerprint
from cluster.routing.kv_index.follower import ActorIndexSource, IndexSource, StaticIndexSource
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.index import KVIndex
from cluster.routing.load_tracker import LoadTracker
from cluster.routing.policy_types import (
    PoolRole,
    ReplicaLoad,
    RoutingDecision,
    RoutingInputs,
    SessionPin,
)
from cluster.routing.prefix_copy_delivery import CopyOutcome, PrefixCopyDelivery
from cluster.routing.request_features import read_routing_keys
from cluster.routing.router_kwargs import RouterSettings
from cluster.routing.routing_metrics import routing_metrics
from cluster.routing.serve_prefix_caller import ServeReplicaCaller
from cluster.routing.sessions import SessionAffinity
from core.codec import from_plain
from core.config import pool_key
from core.errors import MessageError
from core.messages import RoutingKeys, WarmPrefixRequest
from core.stats import RoutingStats

logger = logging.getLogger(__name__)


class PdserveRequestRouter(RequestRouter):
    """Routes with the policy named in ``request_router_kwargs["policy"]`` (default below)."""

    default_policy: ClassVar[str] = "prefix_aware"

    def initialize_state(self, **kwargs: Any) -> None:
        """Called by Serve with ``request_router_kwargs`` (see ``RouterSettings``)."""
        kwargs.setdefault("policy", self.default_policy)
        self.settings = RouterSettings.from_kwargs(kwargs)
        self.policy = self.settings.make_policy()
        self.sessions = SessionAffinity(self.settings.session_ttl_s, self.settings.max_sessions)
        self.load = LoadTracker()
        self.metrics = routing_metrics()
        self.metrics.record_policy(self.settings.pool.value, self.settings.policy)
        self._num_decisions = 0
        self._rng = random.Random()
        self._stats_cache: dict[str, tuple[object, RoutingStats]] = {}
        self._block_bytes = 0  # a KV block's bytes, as the replicas report it
        self.hot_prefixes: HotPrefixes | None = self._make_hot_prefixes()
        self._live_generation = 0  # the last ``live_settings`` value taken (0: the kwargs')
        self.copy_delivery: PrefixCopyDelivery | None = None  # made by the first copy to deliver
        self._deployment_name = ""  # the pool's Serve deployment, as its replicas name it
        self.index_source: IndexSource = (
            ActorIndexSource(
                self.settings.index_app or self.app_name,
                namespace=self.settings.namespace,
                metrics=self.metrics,
                poll_interval_s=self.settings.poll_interval_s,
                max_staleness_s=self.settings.max_staleness_s,
                num_shards=self.settings.index_shards,
                stride=self.settings.index_stride,
            )
            if self.settings.use_index
            else StaticIndexSource(None)
        )

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Rank every candidate, one replica per rank (no awaits: see the module docstring)."""
        if not candidate_replicas:
            return []
        started_s = time.perf_counter()
        try:
            features = self._features(pending_request)
            if features.replica_id is not None:  # a hot-prefix copy's call: that one, or none
                return [
                    [r] for r in candidate_replicas if r.replica_id.unique_id == features.replica_id
                ]
            self._deployment_name = candidate_replicas[0].replica_id.deployment_id.name
            self._follow_live_settings()
            self.index_source.ensure_started()
            candidate_replicas = of_fingerprint(
                candidate_replicas,
                features.kv_fingerprint,
                self._fingerprint,
            )
            now_s = time.monotonic()
            index = self.index_source.view()
            pool = pool_key(self.settings.pool.value, self.settings.model)
            tier_hits = index.match_tiers(pool, features.block_hashes) if index is not None else {}
            pin = self.sessions.pin_for(features.session_id, now_s)
            scored, unscored = self._shortlist(candidate_replicas, tier_hits, pin)
            inputs = self._inputs(scored, features, index, tier_hits, pin, now_s)
            decision = self.policy.choose(inputs)
            latency_s = time.perf_counter() - started_s
            self._record(decision, features, inputs, pending_request, latency_s)
        except Exception:  # a routing bug must not strand the request: Serve's order then
            logger.exception("routing failed; falling back to Serve's replica order")
            return [[replica] for replica in candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in scored}
        ranked = [[by_id[replica_id]] for replica_id in decision.ranked_replica_ids]
        return ranked + [[replica] for replica in unscored]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        """Serve used ``replica_id`` (maybe a later rank): move the load there."""
        self.load.move(pending_request.metadata.internal_request_id, replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request finished on ``replica_id``: its load is gone."""
        self.load.finish(internal_request_id)
        if self.hot_prefixes is not None:
            self.hot_prefixes.finished(internal_request_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve's new replica set; replicas that left it (died, drained, scaled down) are
        dropped from the index, the load and the session pins."""
        gone = set(self.curr_replicas) - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        deployment = self._deployment_id
        routed_replicas.hold(  # a leaving one may report on while it drains
            deployment.app_name, deployment.name, (r.replica_id.unique_id for r in replicas)
        )
        for replica_id in gone:
            self._forget(replica_id.unique_id)
        with contextlib.suppress(RuntimeError):  # not on a loop: the first choice starts it
            self.index_source.ensure_started()  # sync before the first request if we can

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Drop the replica here and in the index."""
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id)

    def _follow_live_settings(self) -> None:
        """Take the app's routing knobs an in-place upgrade published
        (``cluster.routing.live_settings``): a new policy from this decision on; the hot-prefix
        bookkeeping starts afresh when its policy or config changed (copies already made stay
        where they are and age out on their replicas)."""
        published = live_settings.current(self.app_name)
        if published is None or published.generation == self._live_generation:
            return
        self._live_generation = published.generation
        live = published.routing
        if live == live_settings.LiveRouting(self.settings.policy, self.settings.hot_prefixes):
            return
        before = self.settings.policy
        self.settings = dataclasses.replace(
            self.settings, policy=live.policy, hot_prefixes=live.hot_prefixes
        )
        self.policy = self.settings.make_policy()
        self.hot_prefixes = self._make_hot_prefixes()
        self.metrics.record_policy(self.settings.pool.value, self.settings.policy)
        logger.info(
            "%s router: policy %s -> %s (in place)", self.settings.pool.value, before, live.policy
        )

    def _make_hot_prefixes(self) -> HotPrefixes | None:
        if self.settings.policy != "hot_prefix":
            return None
        return HotPrefixes(
            self.settings.hot_prefixes, pool_key(self.settings.pool.value, self.settings.model)
        )

    def _forget(self, replica_id: str) -> None:
        self._stats_cache.pop(replica_id, None)
        self.load.forget_replica(replica_id)
        self.sessions.forget_replica(replica_id)
        self.index_source.report_replica_gone(replica_id)
        if self.hot_prefixes is not None:
            self.hot_prefixes.forget_replica(replica_id)

    # -- one decision ---------------------------------------------------------------------

    def _features(self, pending_request: PendingRequest | None) -> RoutingKeys:
        if pending_request is None:
            return RoutingKeys()
        return read_routing_keys(
            pending_request.args,
            pending_request.kwargs,
            fallback_session_id=pending_request.metadata.session_id or None,
        )

    def _shortlist(
        self,
        candidates: list[RunningReplica],
        tier_hits: Mapping[str, TierHit],
        pin: SessionPin | None,
    ) -> tuple[list[RunningReplica], list[RunningReplica]]:
        """``(scored, unscored)``: every candidate scored up to ``max_scored_candidates``;
        past it the longest cache hits, the pinned replica and a random sample (see the module
        docstring). The round-robin baseline always rotates over every candidate."""
        limit = self.settings.max_scored_candidates
        if len(candidates) <= limit or self.policy.name == "round_robin":
            return candidates, []
        position = {r.replica_id.unique_id: i for i, r in enumerate(candidates)}
        holders = [rid for rid in tier_hits if rid in position]
        holders.sort(key=lambda rid: -tier_hits[rid].num_blocks)
        chosen = dict.fromkeys(position[rid] for rid in holders[: limit // 2])
        if pin is not None and pin.replica_id in position:
            chosen[position[pin.replica_id]] = None
        others = [i for i in range(len(candidates)) if i not in chosen]
        chosen.update(dict.fromkeys(self._rng.sample(others, limit - len(chosen))))
        scored = [candidates[i] for i in chosen]
        unscored = [r for i, r in enumerate(candidates) if i not in chosen]
        return scored, unscored

    def _inputs(
        self,
        candidates: list[RunningReplica],
        features: RoutingKeys,
        index: KVIndex | None,
        tier_hits: Mapping[str, TierHit],
        pin: SessionPin | None,
        now_s: float,
    ) -> RoutingInputs:
        ids = [r.replica_id.unique_id for r in candidates]
        return RoutingInputs(
            role=self.settings.pool,
            candidates=tuple(self._replica_load(r) for r in candidates),
            block_hashes=features.block_hashes,
            block_size=self.settings.block_size,
            num_prompt_tokens=features.num_prompt_tokens,
            cache_hits={replica_id: hit.num_blocks for replica_id, hit in tier_hits.items()},
            tier_hits=tier_hits,
            index_available=index is not None,
            degraded_replica_ids=frozenset(
                i for i in ids if index is not None and index.is_degraded(i)
            ),
            session_pin=pin,
            now_s=now_s,
            tie_break=self._num_decisions,
            lora_name=features.lora_name,
        )

    def _replica_load(self, replica: RunningReplica) -> ReplicaLoad:
        replica_id = replica.replica_id.unique_id
        stats = self._routing_stats(replica)
        self._block_bytes = stats.kv_block_bytes or self._block_bytes
        num_running = self.load.num_requests(replica_id)
        if self._use_replica_queue_len_cache:
            num_ongoing = self.replica_queue_len_cache.get(replica.replica_id) or 0
            num_running = max(num_running, num_ongoing)
        return ReplicaLoad(
            replica_id=replica_id,
            num_active_tokens=self.load.num_tokens(replica_id),
            num_running_requests=num_running,
            num_queued_requests=stats.num_waiting,
            num_used_blocks=stats.kv_blocks_used,
            num_free_blocks=stats.kv_blocks_free,
            host_block_cost=stats.host_block_cost,
            disk_block_cost=stats.disk_block_cost,
            num_pending_prompt_tokens=stats.pending_prompt_tokens,
            prefill_tokens_per_s=stats.prefill_tokens_per_s,
            device_adapters=frozenset(stats.device_adapters),
            host_adapters=frozenset(stats.host_adapters),
        )

    def _record(
        self,
        decision: RoutingDecision,
        features: RoutingKeys,
        inputs: RoutingInputs,
        pending_request: PendingRequest | None,
        latency_s: float,
    ) -> None:
        self._num_decisions += 1
        now_s = time.monotonic()
        self.sessions.record(features.session_id, decision.replica_id, now_s)
        if pending_request is None:
            return
        # prefill works on the uncached part; decode holds the whole prompt's KV, except under
        # hot_prefix, whose queue is prefill work in both pools (``hit_minus_load``)
        num_work_tokens = features.num_prompt_tokens
        if self.settings.pool is PoolRole.PREFILL or self.hot_prefixes is not None:
            num_work_tokens -= decision.num_cached_blocks * self.settings.block_size
        num_work_tokens = max(num_work_tokens, 0)
        request_id = pending_request.metadata.internal_request_id
        if self.load.begin(request_id, decision.replica_id, num_work_tokens, now_s):
            self.metrics.record_decision(self.settings.pool.value, decision, latency_s)
        if self.hot_prefixes is not None:
            self._record_heat(request_id, inputs, num_work_tokens, now_s)

    def _record_heat(
        self, request_id: str, inputs: RoutingInputs, num_work_tokens: int, now_s: float
    ) -> None:
        """Feed the prefix's heat; a copy it leads to waits in ``hot_prefixes`` for delivery."""
        assert self.hot_prefixes is not None
        before = self.hot_prefixes.counters()
        warm = self.hot_prefixes.placed(
            request_id, inputs, num_work_tokens, now_s, self._block_bytes
        )
        after = self.hot_prefixes.counters()
        if warm is not None:
            logger.info(
                "request %s: prefix %s is hot; copying %d blocks from %s to %s",
                request_id,
                warm.prefix_head,
                len(warm.block_hashes),
                warm.source_replica_id,
                warm.target_replica_id,
            )
        delivering = self.settings.deliver_copies
        self.metrics.record_prefix_copies(
            self.settings.pool.value,
            num_made=after.copies_made_total - before.copies_made_total,
            num_dropped=after.copies_dropped_total - before.copies_dropped_total,
            num_bytes=0 if delivering else after.copy_bytes_total - before.copy_bytes_total,
            num_hot=after.num_hot_prefixes,
        )
        if warm is not None and delivering:
            delivery = self.copy_delivery or self._make_copy_delivery()
            for decided in self.hot_prefixes.take_warm_requests():
                delivery.submit(decided)

    def _make_copy_delivery(self) -> PrefixCopyDelivery:
        """Copies delivered through this pool's own deployment, each call pinned to its
        replica by ``routing.replica_id``; they give up when the replicator would."""
        timeout_s = self.settings.hot_prefixes.copy_interval_s
        caller = ServeReplicaCaller(self._deployment_name, self.app_name, timeout_s=timeout_s)
        self.copy_delivery = PrefixCopyDelivery(caller, self._copy_ended, timeout_s=timeout_s)
        return self.copy_delivery

    def _copy_ended(self, warm: WarmPrefixRequest, outcome: CopyOutcome) -> None:
        """A delivered copy's bytes count as moved; one that landed nothing is dropped. (A
        copy that ends after an in-place policy change away from ``hot_prefix`` still counts
        its bytes; there is no bookkeeping left to drop it from.)"""
        hot = self.hot_prefixes
        num_dropped = 0 if outcome.landed or hot is None else int(hot.give_up(warm))
        self.metrics.record_prefix_copies(
            self.settings.pool.value,
            num_made=0,
            num_dropped=num_dropped,
            num_bytes=outcome.num_bytes,
            num_hot=0 if hot is None else hot.counters().num_hot_prefixes,
        )

    def _fingerprint(self, replica: RunningReplica) -> str:
        """The replica's KV fingerprint: from its routing stats, else (a replica Serve has not
        polled yet) as the stats board reported it (``board_fingerprints``)."""
        reported = self._routing_stats(replica).kv_fingerprint
        return reported or board_fingerprints.of(replica.replica_id.unique_id)

    def _routing_stats(self, replica: RunningReplica) -> RoutingStats:
        """The replica's last ``record_routing_stats``; empty before the first one. Parsed
        once per report: Serve replaces the object when a new one arrives (each second)."""
        plain = replica.routing_stats
        if not plain:
            return RoutingStats()
        replica_id = replica.replica_id.unique_id
        cached = self._stats_cache.get(replica_id)
        if cached is not None and cached[0] is plain:
            return cached[1]
        try:
            stats = from_plain(RoutingStats, plain)
        except MessageError as e:
            logger.warning("replica %s: unreadable routing stats: %s", replica.replica_id, e)
            stats = RoutingStats()
        self._stats_cache[replica_id] = (plain, stats)  # holds ``plain``: its id stays unique
        return stats


class PrefixAwareRequestRouter(PdserveRequestRouter):
    """``prefix_aware``: cached prefix against load (the pdserve default)."""

    default_policy = "prefix_aware"


class LeastLoadedRequestRouter(PdserveRequestRouter):
    """``least_loaded``: the lowest load, cache ignored."""

    default_policy = "least_loaded"


class HotPrefixRequestRouter(PdserveRequestRouter):
    """``hot_prefix``: hit minus load in seconds, with heat and deliberate prefix copies."""

    default_policy = "hot_prefix"


class RoundRobinRequestRouter(PdserveRequestRouter):
    """``round_robin``: the baseline."""

    default_policy = "round_robin"
