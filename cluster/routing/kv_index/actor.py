"""The KV index as a named, detached Ray actor, and the worker-side hook that feeds it.

One actor per Serve application (name ``pdserve-kv-index-<app>`` in namespace ``pdserve``), or
with ``routing.kv_index_shards: S`` one per shard (``pdserve-kv-index-<app>-shard<k>of<S>``, each
following the replicas ``shard_assignment.shard_of`` gives it), created on first use by
whichever side needs it first (``get_if_exists``), with 0 CPUs.
Each shard also listens for its replicas' KV event streams (``stream``: one TCP connection per
replica, batches as packed frames), which is how batches reach it; registrations, snapshots,
removals and the routers' polls are actor calls, whose messages (``core.kv_index_messages``)
cross as plain data through ``core.codec``: the actor decodes what it is sent and encodes what it
answers, and its callers do the same on their side. Detached so that it does not share the fate
of the replica that happened to create it; a
restart gives it a new epoch, after which routers reload and workers resync by themselves.
``pdserve down`` removes it with :func:`kill_index_actor`.

Worker wiring (in the roles' ``deployment.py``, through the factory the app builder passes)::

    publisher = factory.start(serve.get_replica_context().replica_id.unique_id,
                              serve.get_replica_context().app_name)
    worker = build_prefill_worker(..., kv_event_callback=publisher.callback)
    ...
    publisher.close()       # on shutdown: stop the thread, deregister from the index
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from cluster.routing.kv_index.compaction import TierSnapshot
from cluster.routing.kv_index.event_relay import KVEventPump, KVEventRelay
from cluster.routing.kv_index.replication import KVIndexServer
from cluster.routing.kv_index.shard_assignment import shard_of
from cluster.routing.kv_index.stream import StreamClient, StreamServer
from core.codec import from_plain, to_plain
from core.kv_events import KVEventBatch
from core.kv_index_messages import CompactBatch, PublishReply, ReplicaSnapshot

logger = logging.getLogger(__name__)

INDEX_NAMESPACE = "pdserve"


class KVIndexShard:
    """A :class:`KVIndexServer` as the actor runs it: its methods take and answer plain data
    (``core.codec``), and it serves its replicas' KV event streams (``stream``), which publish
    on a thread of their own (the server's methods take its lock)."""

    def __init__(self, **kwargs: Any) -> None:
        self.server = KVIndexServer(**kwargs)
        host = ray.util.get_node_ip_address()
        self._stream = StreamServer(self.server.publish, host=host, advertise=host)
        # what the worker process loaded so far lives as long as it does: keep it out of the
        # collector's full passes, which otherwise stall the stream for tens of milliseconds
        gc.collect()
        gc.freeze()

    def stream_endpoint(self) -> tuple[str, int, bytes]:
        """Where replicas send their batches, and the token they present."""
        return self._stream.endpoint()

    def publish(self, replica_id: str, batches: list[Any]) -> Any:
        """``KVIndexServer.publish`` of plain :class:`CompactBatch` es (the stream is how
        replicas publish; this call serves tools and tests); a plain :class:`PublishReply`."""
        decoded = [from_plain(CompactBatch, batch) for batch in batches]
        return to_plain(self.server.publish(replica_id, decoded))

    def resync(self, snapshot: Any) -> None:
        """``KVIndexServer.resync`` of a plain :class:`ReplicaSnapshot`."""
        s = from_plain(ReplicaSnapshot, snapshot)
        self.server.resync(s.replica_id, s.pool, s.hashes, s.seq, s.tiers)

    def remove_replica(self, replica_id: str) -> bool:
        """``KVIndexServer.remove_replica``."""
        return self.server.remove_replica(replica_id)

    def updates(self, epoch: str | None, cursor: int) -> Any:
        """``KVIndexServer.updates`` as a plain ``UpdatesReply``."""
        return self.server.updates_plain(epoch, cursor)

    def stats(self) -> Any:
        """``KVIndexServer.stats`` as a plain ``ShardStats``."""
        return to_plain(self.server.stats())


KVIndexActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(KVIndexShard)


def index_actor_name(app_name: str, shard: int = 0, num_shards: int = 1) -> str:
    """The actor name of an application's KV index (of one of its ``num_shards`` shards)."""
    name = f"pdserve-kv-index-{app_name or 'default'}"
    return name if num_shards == 1 else f"{name}-shard{shard}of{num_shards}"


def get_or_create_index_actor(
    app_name: str,
    *,
    namespace: str = INDEX_NAMESPACE,
    replica_ttl_s: float = 30.0,
    shard: int = 0,
    num_shards: int = 1,
) -> Any:
    """The application's index actor handle (``shard`` of ``num_shards``), creating it if
    needed (a blocking GCS call: never call this on an event loop; use ``asyncio.to_thread``)."""
    return KVIndexActor.options(
        name=index_actor_name(app_name, shard, num_shards),
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached",
    ).remote(replica_ttl_s=replica_ttl_s)


def kill_index_actor(app_name: str, *, namespace: str = INDEX_NAMESPACE) -> bool:
    """Remove the application's index actor and every shard of it, whatever shard count it
    ran with; False when there was none."""
    name = index_actor_name(app_name)
    killed = False
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] != namespace:
            continue
        if actor["name"] == name or actor["name"].startswith(f"{name}-shard"):
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(actor["name"], namespace=namespace), no_restart=True)
                killed = True
    return killed


class ActorIndexSink:
    """:class:`~cluster.routing.kv_index.event_relay.IndexSink` over the actor (the shard that
    follows the pump's replica), for the pump thread (blocking ``ray.get`` with a timeout;
    re-looks the actor up after a failure)."""

    def __init__(
        self,
        app_name: str,
        *,
        namespace: str,
        timeout_s: float = 5.0,
        shard: int = 0,
        num_shards: int = 1,
    ) -> None:
        self._app_name = app_name
        self._namespace = namespace
        self._timeout_s = timeout_s
        self._shard = shard
        self._num_shards = num_shards
        self._actor: Any = None
        self._stream: StreamClient | None = None

    def publish(self, replica_id: str, batches: Sequence[CompactBatch]) -> PublishReply:
        """See ``IndexSink.publish``: over the shard's KV event stream (connected on first
        use, reconnected after a failure)."""
        try:
            if self._stream is None:
                endpoint = tuple(self._call("stream_endpoint"))
                self._stream = StreamClient(endpoint, replica_id, self._timeout_s)
            return self._stream.publish(batches)
        except Exception:
            self._close_stream()
            self._actor = None  # the shard may have restarted elsewhere: look it up again
            raise

    def _close_stream(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None

    def resync(
        self,
        replica_id: str,
        pool: str,
        hashes: Sequence[int],
        seq: int,
        tiers: TierSnapshot | None = None,
    ) -> None:
        """See ``IndexSink.resync``."""
        lower = {medium: list(h) for medium, h in (tiers or {}).items()}
        snapshot = ReplicaSnapshot(replica_id, pool, list(hashes), seq, lower)
        self._call("resync", to_plain(snapshot))

    def remove_replica(self, replica_id: str) -> bool:
        """See ``IndexSink.remove_replica`` (the replica drains: its stream closes too)."""
        self._close_stream()
        return bool(self._call("remove_replica", replica_id))

    def _call(self, method: str, *args: Any) -> Any:
        if self._actor is None:
            self._actor = get_or_create_index_actor(
                self._app_name,
                namespace=self._namespace,
                shard=self._shard,
                num_shards=self._num_shards,
            )
        try:
            return ray.get(getattr(self._actor, method).remote(*args), timeout=self._timeout_s)
        except Exception:
            self._actor = None  # look it up again next time (it may have been recreated)
            raise


@dataclass
class IndexPublisher:
    """A running worker-side hook: ``callback`` goes to the engine, ``close`` on shutdown."""

    relay: KVEventRelay
    pump: KVEventPump

    def callback(self, batch: KVEventBatch) -> None:
        """The engine's ``kv_event_callback``."""
        self.relay(batch)

    def close(self) -> None:
        """Stop publishing and deregister the replica from the index."""
        self.pump.close()


@dataclass(frozen=True)
class IndexPublisherFactory:
    """Picklable settings the app builder passes to each Prefill/Decode deployment."""

    pool: str
    namespace: str = INDEX_NAMESPACE
    flush_interval_s: float = 0.01
    heartbeat_s: float = 2.0
    num_shards: int = 1
    stride: int = 1
    index_app: str = ""
    """The app whose index to publish to (empty: the replica's own; a rolling upgrade's second
    app names the running one)."""

    def start(self, replica_id: str, app_name: str) -> IndexPublisher:
        """Create the relay and start the pump thread for one replica (publishing to the
        shard that follows it)."""
        app_name = self.index_app or app_name
        relay = KVEventRelay(stride=self.stride)
        shard = shard_of(replica_id, self.num_shards)
        sink = ActorIndexSink(
            app_name, namespace=self.namespace, shard=shard, num_shards=self.num_shards
        )
        pump = KVEventPump(
            relay,
            sink,
            replica_id,
            self.pool,
            flush_interval_s=self.flush_interval_s,
            heartbeat_s=self.heartbeat_s,
        )
        pump.start()
        name = index_actor_name(app_name, shard, self.num_shards)
        logger.info("replica %s publishes KV events to %s", replica_id, name)
        return IndexPublisher(relay, pump)
