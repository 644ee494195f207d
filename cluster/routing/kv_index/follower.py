"""The router-side copy of the KV index, kept current by a background task.

Why a local follower and not a query per request: a Ray actor call costs ~0.7 ms and would put the
index actor on every request's path; replica-reported ``routing_stats`` arrive every few seconds and
would have to carry every cached hash. Instead each router polls the index actor's change log every
``poll_interval_s`` (``KVIndexServer.updates``) from a task on its own event loop, and matches
prompts against its local :class:`~cluster.routing.kv_index.replication.KVIndexFollower` in
microseconds: a routing decision never awaits anything. When the last successful poll is older than
``max_staleness_s`` the view reports itself unavailable and the policy falls back to load (reason
``degraded_index``). With a sharded index (``routing.kv_index_shards``) one poll asks every shard
at once and merges the replies into the one local index; a shard unreachable for longer than
``max_staleness_s`` has its replicas degraded (their hits count as none, so they are chosen by
load and session affinity; counted in ``pdserve:kv_index_shard_losses_total``) until a poll
reaches it again and reloads it from a snapshot; the view is unavailable only when no shard is
fresh.

:class:`IndexSource` is what the router needs; :class:`StaticIndexSource` serves a fixed index
(tests, benchmarks of the policy) and :class:`ActorIndexSource` is the Ray implementation. The
ingress holds one of its own (an explicit handle, passed to its disaggregation decision) to ask
how much of a prompt the decode pool already caches (:meth:`ActorIndexSource.best_match`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ray

from cluster.routing.kv_index.actor import get_or_create_index_actor
from cluster.routing.kv_index.index import KVIndex
from cluster.routing.kv_index.replication import KVIndexFollower
from cluster.routing.kv_index.shard_assignment import shard_of
from cluster.routing.routing_metrics import RoutingMetrics
from core.kv_index_messages import UpdatesReply, decode_updates_reply

logger = logging.getLogger(__name__)

_MAX_BACKOFF_S = 2.0


class IndexSource(Protocol):
    """The router's access to the KV index."""

    def ensure_started(self) -> None:
        """Start background syncing if not yet running (called on the router's loop)."""
        ...

    def view(self) -> KVIndex | None:
        """The current index, or ``None`` when it is missing or too stale to trust."""
        ...

    def report_replica_gone(self, replica_id: str) -> None:
        """Tell the index a replica died (fire and forget; never blocks)."""
        ...


class StaticIndexSource:
    """An :class:`IndexSource` over a given index (``None``: no index available)."""

    def __init__(self, index: KVIndex | None) -> None:
        self.index = index
        self.gone: list[str] = []

    def ensure_started(self) -> None:
        """Nothing to start."""

    def view(self) -> KVIndex | None:
        """The given index."""
        return self.index

    def report_replica_gone(self, replica_id: str) -> None:
        """Remove it from the given index."""
        self.gone.append(replica_id)
        if self.index is not None:
            self.index.remove_replica(replica_id)


class ActorIndexSource:
    """Follows the application's index actor from a task on the router's event loop."""

    def __init__(
        self,
        app_name: str,
        *,
        namespace: str,
        metrics: RoutingMetrics,
        poll_interval_s: float = 0.05,
        max_staleness_s: float = 5.0,
        call_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        actor: Any = None,
        num_shards: int = 1,
        actors: Sequence[Any] | None = None,
        stride: int = 1,
    ) -> None:
        """``actor`` (unsharded) or ``actors`` (one per shard): index actor handles to use
        instead of looking them up by name."""
        self.app_name = app_name
        self.namespace = namespace
        self.poll_interval_s = poll_interval_s
        self.max_staleness_s = max_staleness_s
        self.call_timeout_s = call_timeout_s
        self.num_shards = num_shards
        self.follower = KVIndexFollower(num_shards, stride)
        self._metrics = metrics
        self._clock = clock
        self._last_sync_s: list[float | None] = [None] * num_shards
        self._lost = [False] * num_shards
        self._actors: list[Any] = list(actors) if actors is not None else [actor] * num_shards
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # for readers on other threads (best_match)

    def ensure_started(self) -> None:
        """Start the polling task on the running loop (once)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Stop polling (the owner is going away)."""
        if self._task is not None:
            self._task.cancel()

    def view(self) -> KVIndex | None:
        """The follower's index while some shard's last sync is recent enough."""
        now_s = self._clock()
        fresh = any(t is not None and now_s - t <= self.max_staleness_s for t in self._last_sync_s)
        return self.follower.index if fresh else None

    def best_match(self, pool: str, block_hashes: Sequence[int]) -> int:
        """The longest usable prefix (in blocks, device plus host and disk tiers) over
        ``pool``'s healthy replicas; 0 while the view is unavailable. Safe from any thread."""
        with self._lock:
            index = self.view()
            if index is None:
                return 0
            return max(index.match(pool, block_hashes).values(), default=0)

    def report_replica_gone(self, replica_id: str) -> None:
        """Ask the replica's shard to drop it (its log then tells every router)."""
        actor = self._actors[shard_of(replica_id, self.num_shards)]
        if actor is not None:
            actor.remove_replica.remote(replica_id)

    async def sync_once(self) -> None:
        """One poll of every shard at once: fetch and apply the changes since the last one.
        Raises the first shard's failure after applying what the others returned."""
        replies = await asyncio.gather(
            *(self._poll(shard) for shard in range(self.num_shards)), return_exceptions=True
        )
        now_s = self._clock()
        failure: BaseException | None = None
        synced = False
        with self._lock:
            for shard, reply in enumerate(replies):
                if isinstance(reply, BaseException):
                    self._actors[shard] = None  # look it up again (it may be recreated)
                    failure = failure or reply
                    self._check_stale(shard, now_s)
                    continue
                if self.follower.apply_update(reply, shard):
                    self._metrics.record_index_restart()
                    logger.info(
                        "KV index shard %d of app %s restarted: reloaded", shard, self.app_name
                    )
                self._last_sync_s[shard] = now_s
                self._lost[shard] = False
                synced = True
        if synced:
            self._metrics.record_index(self.follower.index.stats())
        if failure is not None:
            raise failure

    async def _poll(self, shard: int) -> UpdatesReply:
        if self._actors[shard] is None:
            self._actors[shard] = await asyncio.to_thread(
                _index_actor_while_connected,
                self.app_name,
                namespace=self.namespace,
                shard=shard,
                num_shards=self.num_shards,
            )
        epoch, cursor = self.follower.epochs[shard], self.follower.cursors[shard]
        ref = self._actors[shard].updates.remote(epoch, cursor)
        return decode_updates_reply(await asyncio.wait_for(ref, self.call_timeout_s))

    def _check_stale(self, shard: int, now_s: float) -> None:
        """Give up on a shard unreachable for longer than ``max_staleness_s`` (once)."""
        last_s = self._last_sync_s[shard]
        if self._lost[shard] or last_s is None or now_s - last_s <= self.max_staleness_s:
            return
        self._lost[shard] = True
        num_replicas = self.follower.forget_shard(shard)
        self._metrics.record_shard_lost()
        logger.warning(
            "KV index shard %d of app %s unreachable: its %d replicas route by load until it "
            "is back",
            shard,
            self.app_name,
            num_replicas,
        )

    async def _run(self) -> None:
        num_failures = 0
        while ray.is_initialized():  # after ray.shutdown() stop, never auto-start a new Ray
            try:
                await self.sync_once()
                num_failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the actor is remote: keep trying, the view goes stale
                num_failures += 1
                log = logger.warning if num_failures == 1 else logger.debug
                log(
                    "KV index sync failed for app %s (%d in a row): %s",
                    self.app_name,
                    num_failures,
                    e,
                )
            backoff_s = min(self.poll_interval_s * 2 ** min(num_failures, 10), _MAX_BACKOFF_S)
            await asyncio.sleep(backoff_s)


def _index_actor_while_connected(app_name: str, **kwargs: Any) -> Any:
    """The shard's index actor, looked up only while this process is connected to Ray: any Ray
    call made after ``ray.shutdown()`` would start (or join) a Ray of its own, and a poller
    of a router whose driver disconnected must end instead."""
    if not ray.is_initialized():
        raise ConnectionError(f"Ray is not connected: KV index of app {app_name} not looked up")
    return get_or_create_index_actor(app_name, **kwargs)
