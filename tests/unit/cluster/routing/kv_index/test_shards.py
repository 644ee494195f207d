"""A sharded KV index: replicas split over shard servers, routers merging them into one view.

The replay test feeds one event stream to an unsharded server and to shard servers, and asks
both followers for the same placements; the rest covers a shard that stops answering."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from cluster.routing.kv_index.follower import ActorIndexSource
from cluster.routing.kv_index.replication import KVIndexFollower, KVIndexServer
from cluster.routing.kv_index.shard_assignment import shard_of
from cluster.routing.routing_metrics import RoutingMetrics
from core.codec import to_plain
from core.kv_index_messages import CompactBatch, IndexOp, SnapshotReply

POOLS = ("prefill", "decode")
PREFIXES = [[1000 * p + i for i in range(8)] for p in range(3)]  # shared system prompts


def test_shard_of_is_stable_and_in_range() -> None:
    assert shard_of("replica-a", 1) == 0
    assert shard_of("replica-a", 7) == shard_of("replica-a", 7)  # no per-process salt
    assert shard_of("abc", 4) == 2  # CRC-32("abc") = 0x352441C2
    assert {shard_of(f"r{i}", 4) for i in range(64)} == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="num_shards"):
        shard_of("a", 0)


def event_stream(seed: int, num_replicas: int) -> list[tuple[str, str, Any]]:
    """Registrations, batches (stores, removes, tier moves, clears, gaps) and removals."""
    rng = random.Random(seed)
    replicas = [f"replica-{seed}-{i}" for i in range(num_replicas)]
    seqs = dict.fromkeys(replicas, 0)
    held: dict[str, list[int]] = {r: [] for r in replicas}
    stream: list[tuple[str, str, Any]] = []
    for i, replica in enumerate(replicas):
        stream.append(("resync", replica, (POOLS[i % 2], [], 0, {})))
    for _ in range(400):
        replica = rng.choice(replicas)
        roll = rng.random()
        if roll < 0.02:
            stream.append(("remove", replica, None))
            stream.append(("resync", replica, (POOLS[rng.randrange(2)], held[replica], 0, {})))
            seqs[replica] = 0
            continue
        if roll < 0.04:  # a gap: the replica is degraded until its snapshot
            seqs[replica] += 2
        if roll < 0.07:
            stream.append(("resync", replica, (None, held[replica], seqs[replica], {})))
            continue
        prefix = rng.choice(PREFIXES)[: rng.randrange(1, 9)]
        session = [rng.getrandbits(40) for _ in range(rng.randrange(0, 6))]
        ops: list[IndexOp] = [IndexOp("stored", prefix + session, "device")]
        if held[replica] and rng.random() < 0.4:
            evicted = rng.sample(held[replica], k=min(3, len(held[replica])))
            ops.append(IndexOp("removed", evicted, "device"))
            ops.append(IndexOp("stored", evicted, rng.choice(["host", "disk"])))
        if rng.random() < 0.03:
            ops.append(IndexOp("cleared", [], "device"))
        held[replica] = list(dict.fromkeys(held[replica] + prefix + session))[-40:]
        stream.append(("publish", replica, [CompactBatch(seqs[replica], tuple(ops))]))
        seqs[replica] += 1
    return stream


def feed(server: KVIndexServer, kind: str, replica: str, payload: Any) -> None:
    if kind == "resync":
        pool, hashes, seq, tiers = payload
        if pool is None:
            pool = server.index.pool_of(replica)
            if pool is None:
                return
        server.resync(replica, pool, hashes, seq, tiers)
    elif kind == "remove":
        server.remove_replica(replica)
    else:
        server.publish(replica, payload)


def prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed + 1)
    return [rng.choice(PREFIXES)[: rng.randrange(1, 9)] for _ in range(20)]


@pytest.mark.parametrize("num_shards", [2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_sharded_and_unsharded_indexes_place_every_request_alike(
    seed: int, num_shards: int
) -> None:
    whole, whole_follower = KVIndexServer(), KVIndexFollower()
    shards = [KVIndexServer() for _ in range(num_shards)]
    merged = KVIndexFollower(num_shards)
    for step, (kind, replica, payload) in enumerate(event_stream(seed, 24)):
        feed(whole, kind, replica, payload)
        feed(shards[shard_of(replica, num_shards)], kind, replica, payload)
        if step % 37 == 0:  # followers poll at arbitrary points of the stream
            whole_follower.apply_update(whole.updates(whole_follower.epoch, whole_follower.cursor))
            for k, shard in enumerate(shards):
                merged.apply_update(shard.updates(merged.epochs[k], merged.cursors[k]), k)
    whole_follower.apply_update(whole.updates(whole_follower.epoch, whole_follower.cursor))
    for k, shard in enumerate(shards):
        merged.apply_update(shard.updates(merged.epochs[k], merged.cursors[k]), k)
    num_hits = 0
    for pool in POOLS:
        for prompt in prompts(seed):
            expected = whole.index.match_tiers(pool, prompt)
            assert whole_follower.index.match_tiers(pool, prompt) == expected
            assert merged.index.match_tiers(pool, prompt) == expected
            num_hits += len(expected)
    assert num_hits > 20  # the stream leaves shared prefixes cached on many replicas
    assert sorted(merged.index.replica_ids()) == sorted(whole.index.replica_ids())
    assert merged.index.stats().num_entries == whole.index.stats().num_entries


def test_a_forgotten_shard_reloads_from_a_snapshot() -> None:
    shards = [KVIndexServer(), KVIndexServer()]
    replicas = {shard_of(f"r{i}", 2): f"r{i}" for i in range(8)}
    for k, replica in replicas.items():
        shards[k].resync(replica, "prefill", [1, 2, 3], 0)
    merged = KVIndexFollower(2)
    for k, shard in enumerate(shards):
        merged.apply_update(shard.updates(None, 0), k)
    assert merged.index.match("prefill", [1, 2]) == {replicas[0]: 2, replicas[1]: 2}
    assert merged.forget_shard(1) == 1
    assert merged.index.match("prefill", [1, 2]) == {replicas[0]: 2}
    assert merged.index.is_degraded(replicas[1])
    update = shards[1].updates(merged.epochs[1], merged.cursors[1])
    assert isinstance(update, SnapshotReply)  # a forgotten shard is reloaded whole
    merged.apply_update(update, 1)
    assert merged.index.match("prefill", [1, 2]) == {replicas[0]: 2, replicas[1]: 2}


class ShardActor:
    """A shard actor whose ``.remote`` calls answer plain data (awaitables, as the actor's
    ``core.codec`` boundary does) or fail while ``down``."""

    def __init__(self, server: KVIndexServer) -> None:
        self.server = server
        self.down = False
        self.updates = self._method("updates")
        self.remove_replica = self._method("remove_replica")

    def _method(self, name: str) -> Any:
        actor = self

        class Handle:
            @staticmethod
            def remote(*args: Any) -> Any:
                future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                if actor.down:
                    future.set_exception(ConnectionError("shard actor died"))
                else:
                    future.set_result(to_plain(getattr(actor.server, name)(*args)))
                return future

        return Handle()


@pytest.mark.timeout(20)
def test_a_router_routes_an_unreachable_shards_replicas_by_load_until_it_is_back() -> None:
    servers = [KVIndexServer(), KVIndexServer()]
    replicas = {shard_of(f"r{i}", 2): f"r{i}" for i in range(8)}
    for k, replica in replicas.items():
        servers[k].resync(replica, "prefill", [1, 2], 0)
    actors = [ShardActor(s) for s in servers]
    now = [0.0]
    metrics = RoutingMetrics()
    source = ActorIndexSource(
        "test-app",
        namespace="pdserve",
        metrics=metrics,
        max_staleness_s=5.0,
        clock=lambda: now[0],
        num_shards=2,
        actors=actors,
    )

    async def body() -> None:
        await source.sync_once()
        assert source.best_match("prefill", [1, 2]) == 2
        actors[1].down = True
        now[0] = 3.0
        with pytest.raises(ConnectionError):
            await source.sync_once()
        view = source.view()
        assert view is not None and not view.is_degraded(replicas[1])  # not stale yet
        now[0] = 6.0
        source._actors[1] = actors[1]  # the router looks a dead shard up by name; here: the fake
        with pytest.raises(ConnectionError):
            await source.sync_once()
        view = source.view()
        assert view is not None  # shard 0 is fresh: the view stays
        assert view.is_degraded(replicas[1]) and not view.is_degraded(replicas[0])
        assert view.match("prefill", [1, 2]) == {replicas[0]: 2}
        assert metrics.snapshot().index_shard_losses_total == 1
        source._actors[1] = actors[1]
        with pytest.raises(ConnectionError):
            await source.sync_once()
        assert metrics.snapshot().index_shard_losses_total == 1  # counted once per loss
        actors[1].down = False
        source._actors[1] = actors[1]
        now[0] = 7.0
        await source.sync_once()
        view = source.view()
        assert view is not None and not view.is_degraded(replicas[1])
        assert view.match("prefill", [1, 2]) == {replicas[0]: 2, replicas[1]: 2}
        source.report_replica_gone(replicas[1])  # goes to the replica's own shard

    asyncio.run(body())
    assert servers[1].index.replica_ids() == [] and servers[0].index.replica_ids() == [replicas[0]]


def test_a_restarted_shard_is_reloaded_and_counted() -> None:
    servers = [KVIndexServer()]
    servers[0].resync("a", "prefill", [1, 2], 0)
    actor = ShardActor(servers[0])
    metrics = RoutingMetrics()
    source = ActorIndexSource("test-app", namespace="pdserve", metrics=metrics, actors=[actor])

    async def body() -> None:
        await source.sync_once()
        assert source.best_match("prefill", [1, 2]) == 2
        actor.server = KVIndexServer()  # Ray restarted the actor: empty, a new epoch
        await source.sync_once()
        assert source.best_match("prefill", [1, 2]) == 0
        actor.server.resync("a", "prefill", [1, 2], 5)  # the replica's pump republishes
        await source.sync_once()
        assert source.best_match("prefill", [1, 2]) == 2

    asyncio.run(body())
    assert metrics.snapshot().index_restarts_total == 1


def test_a_router_not_connected_to_ray_does_not_start_one_to_look_its_index_up() -> None:
    import ray

    assert not ray.is_initialized()
    source = ActorIndexSource("test-app", namespace="pdserve", metrics=RoutingMetrics())
    with pytest.raises(ConnectionError, match="not connected"):
        asyncio.run(source.sync_once())
    assert not ray.is_initialized()  # a lookup by name would have started a local Ray
