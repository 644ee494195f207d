"""The control plane at a thousand replicas, without a GPU: KV index ingest, lag, routing
decisions, index memory and the stats board, on the real code paths.

Simulated replicas stand in for engines; everything else is pdserve's own: the index shards are
``KVIndexActor`` Ray actors (``cluster.routing.kv_index.actor``) taking ``publish`` calls in the
pump's wire form, the router's view is an ``ActorIndexSource`` polling them, decisions come from
a ``PrefixAwareRequestRouter`` (Serve's request-router class, driven as Serve drives it) over an
index of N replicas, and the board is ``StatsBoard``.

Stated event rates (``stated_rates``): on an H100 a prefill replica computes ~100K prompt
tokens/s and a decode replica emits ~20K tokens/s at batch 64 (``docs/benchmarks.md``). For
8K-token prompts and 256-token answers a prefill replica serves 12.2 requests/s and a decode
replica 78, so the planner runs ~6.4 prefill replicas per decode replica. Every computed block
(16 tokens) is stored in the prefill replica's prefix cache and, at steady state, one is evicted
for each: 12,500 events/s per prefill replica. A decode replica stores every imported prompt
block and every filled output block and evicts as many: 82,500 events/s. A simulated replica
emits that many (divided by ``routing.kv_index_stride``, whose sampled hashes the relay alone
would send), half stores of new hashes and half evictions of its oldest (every store new to
the index: the costly case; a shared system prompt's re-store only sets a bit), and publishes
like ``KVEventPump``: one frame in flight, coalescing 10 ms. The routing workload carries the
prefix structure (shared system prompts, multi-turn sessions).

Measured, in one run:

- ``route``: decision latency p50/p99 of the real router for N in ``--replicas`` and prompt
  lengths in ``--prompt-tokens`` (every replica a candidate, each holding
  ``--blocks-per-replica`` blocks: 8 shared 1K-token system prompts and multi-turn sessions;
  70% of requests continue a session, 30% start one);
- ``index_bytes_per_block``: traced Python memory of an index of 1,024 such replicas over its
  (block, replica) entries; the follower's replay rate (what every router pays per event);
- ``ingest``: events/s one shard and two shards apply on this machine's cores when every
  replica of a fleet at the stated rates has its calls queued, each call carrying ``--cycle-ms``
  of its replica's events (a loaded pump's batch: 625 for prefill, 4,125 for decode at 50 ms),
  and the calls/s one shard takes when each carries only 10 (its fixed cost per call);
- ``lag``: for a fleet at the stated rates, p50/p99 from an event's emission to its appearance in
  a router's view, and the offered rate; a sweep finds the highest offered rate with lag p99
  under 100 ms for one shard;
- ``stats_board``: CPU per report and per snapshot of the board at 1,024 replicas.

    .venv/bin/python benchmarks/control_plane_scale.py

The last line is one JSON object with ``ingest_events_per_s_1shard``, ``shard_scaling_2``,
``route_p99_ms_8k_1024``, ``index_bytes_per_block`` and ``lag_p99_ms`` (256 replicas at the
stated rates) among the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.codec import to_plain
from core.kv_index_messages import CompactBatch, IndexOp, ReplicaSnapshot

BLOCK_SIZE = 16
SYSTEM_PROMPTS = 8
SYSTEM_PROMPT_BLOCKS = 64  # 1K tokens
SESSION_BLOCKS = 500  # an 8K-token conversation
CONTINUE_SHARE = 0.7  # requests that continue a cached session
FLUSH_S = 0.01  # KVEventPump's coalescing interval
POLL_S = 0.05  # the router's index poll interval
LAG_TARGET_MS = 100.0

PREFILL_TOKENS_PER_S = 100_000
DECODE_TOKENS_PER_S = 20_000
PROMPT_TOKENS = 8192
OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class Rates:
    """Hash events per second of one replica of each pool, and the prefill share of a pool."""

    prefill_events_per_s: float
    decode_events_per_s: float
    prefill_share: float

    def events_per_s(self, num_replicas: int, stride: int = 1) -> float:
        """The fleet's offered event rate at ``stride``."""
        num_prefill = round(num_replicas * self.prefill_share)
        num_decode = num_replicas - num_prefill
        total = num_prefill * self.prefill_events_per_s + num_decode * self.decode_events_per_s
        return total / stride


def stated_rates() -> Rates:
    """The per-replica event rates derived in the module docstring."""
    prefill_requests_per_s = PREFILL_TOKENS_PER_S / PROMPT_TOKENS
    decode_requests_per_s = DECODE_TOKENS_PER_S / OUTPUT_TOKENS
    prefill_blocks_per_s = PREFILL_TOKENS_PER_S / BLOCK_SIZE
    decode_blocks_per_s = (
        decode_requests_per_s * PROMPT_TOKENS / BLOCK_SIZE + DECODE_TOKENS_PER_S / BLOCK_SIZE
    )
    prefill_per_decode = decode_requests_per_s / prefill_requests_per_s
    return Rates(
        prefill_events_per_s=2 * prefill_blocks_per_s,  # a store and an eviction per block
        decode_events_per_s=2 * decode_blocks_per_s,
        prefill_share=prefill_per_decode / (1 + prefill_per_decode),
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", default="16,64,256,1024", help="N values for routing.")
    p.add_argument("--prompt-tokens", default="512,2048,8192,32768")
    p.add_argument("--blocks-per-replica", type=int, default=2000)
    p.add_argument("--decisions", type=int, default=300, help="Per (N, prompt length).")
    p.add_argument("--memory-replicas", type=int, default=1024)
    p.add_argument(
        "--cycle-ms",
        type=float,
        default=50.0,
        help="A loaded pump's time between calls: each ingest call carries this much of its "
        "replica's events.",
    )
    p.add_argument("--ingest-replicas", type=int, default=128)
    p.add_argument("--ingest-calls", type=int, default=40, help="Per replica.")
    p.add_argument("--lag-replicas", type=int, default=256)
    p.add_argument("--lag-shards", type=int, default=2)
    p.add_argument("--lag-stride", type=int, default=16)
    p.add_argument("--lag-seconds", type=float, default=6.0)
    p.add_argument("--sweep", default="100000,200000,400000,800000", help="Offered events/s.")
    p.add_argument("--sweep-replicas", type=int, default=16)
    p.add_argument("--board-replicas", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


# -- the workload ---------------------------------------------------------------------------


@dataclass
class Fleet:
    """What N replicas cache: shared system prompts and each replica's sessions."""

    system_prompts: list[list[int]]
    sessions: list[tuple[int, list[int]]]  # (replica, blocks from the start of the prompt)
    held: list[list[int]]  # per replica

    @classmethod
    def build(cls, num_replicas: int, blocks_per_replica: int, rng: random.Random) -> Fleet:
        """Every replica holds one system prompt and sessions that start with it."""
        system = [
            [rng.getrandbits(63) for _ in range(SYSTEM_PROMPT_BLOCKS)]
            for _ in range(SYSTEM_PROMPTS)
        ]
        sessions: list[tuple[int, list[int]]] = []
        held: list[list[int]] = []
        for r in range(num_replicas):
            blocks = list(system[r % SYSTEM_PROMPTS])
            while len(blocks) < blocks_per_replica:
                size = min(SESSION_BLOCKS, blocks_per_replica - len(blocks))
                session = [rng.getrandbits(63) for _ in range(size)]
                sessions.append((r, system[r % SYSTEM_PROMPTS] + session))
                blocks += session
            held.append(blocks)
        return cls(system, sessions, held)

    def prompt(self, num_blocks: int, rng: random.Random) -> list[int]:
        """A request's block hashes: a session continued, or a new one on a system prompt."""
        if self.sessions and rng.random() < CONTINUE_SHARE:
            _, start = rng.choice(self.sessions)
        else:
            start = rng.choice(self.system_prompts)
        start = start[:num_blocks]
        return start + [rng.getrandbits(63) for _ in range(num_blocks - len(start))]


def build_index(fleet: Fleet, pool: str, stride: int = 1) -> Any:
    """The KV index a router would follow for ``fleet`` (replica ``r{i}`` of ``pool``)."""
    from cluster.routing.kv_index.index import KVIndex

    index = KVIndex(stride=stride)
    for r, blocks in enumerate(fleet.held):
        index.resync(f"r{r}", [], 0, pool=pool)
        sampled = [h for h in blocks if h % stride == 0]
        index.apply_ops(f"r{r}", 0, [IndexOp("stored", sampled)])
    return index


# -- routing decisions ----------------------------------------------------------------------


@dataclass
class FakeReplica:
    """What Serve's router reads from a ``RunningReplica``."""

    replica_id: Any
    routing_stats: dict[str, Any]
    max_ongoing_requests: int = 32
    multiplexed_model_ids: set[str] = field(default_factory=set)

    async def get_queue_len(self, *, deadline_s: float) -> int:
        """Never probed: the router ranks without it."""
        return 0


def measure_routing(
    num_replicas: int,
    prompt_tokens: Sequence[int],
    args: argparse.Namespace,
    stride: int = 1,
) -> dict[str, dict[str, float]]:
    """Decision latency p50/p99 (ms) of the real prefix-aware router per prompt length."""
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve.request_router import PendingRequest, ReplicaID

    from cluster.routing.kv_index.follower import StaticIndexSource
    from cluster.routing.routing_metrics import RoutingMetrics
    from cluster.routing.serve_router import PrefixAwareRequestRouter
    from core.messages import PrefillRequest, RoutingKeys
    from core.sampling import SamplingParams
    from core.stats import RoutingStats

    rng = random.Random(args.seed + num_replicas)
    fleet = Fleet.build(num_replicas, args.blocks_per_replica, rng)
    deployment = DeploymentID(name="Prefill", app_name="control-plane-scale")
    router = PrefixAwareRequestRouter(
        deployment_id=deployment, handle_source=DeploymentHandleSource.UNKNOWN
    )
    router.initialize_state(use_index=False, block_size=BLOCK_SIZE, pool="prefill")
    router.index_source = StaticIndexSource(build_index(fleet, "prefill", stride))
    router.metrics = RoutingMetrics()
    replicas = [
        FakeReplica(
            ReplicaID(unique_id=f"r{r}", deployment_id=deployment),
            to_plain(RoutingStats(r % 4, 1000 + r % 50, 3000 - r % 50)),
        )
        for r in range(num_replicas)
    ]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # Serve's pending requests create futures on the current loop
    results: dict[str, dict[str, float]] = {}
    try:
        for num_tokens in prompt_tokens:
            latencies = []
            for i in range(args.decisions):
                hashes = fleet.prompt(num_tokens // BLOCK_SIZE, rng)
                request = PrefillRequest(
                    f"q{i}", [], SamplingParams(), RoutingKeys(tuple(hashes), num_tokens, None)
                )
                metadata = RequestMetadata(request_id=f"q{i}", internal_request_id=f"q{i}")
                pending = PendingRequest(args=[to_plain(request)], kwargs={}, metadata=metadata)
                started = time.perf_counter()
                loop.run_until_complete(router.choose_replicas(replicas, pending))  # type: ignore[arg-type]
                latencies.append(time.perf_counter() - started)
                router.on_request_completed(replicas[0].replica_id, f"q{i}")
            results[str(num_tokens)] = {
                "p50_ms": round(_quantile(latencies, 0.5) * 1e3, 3),
                "p99_ms": round(_quantile(latencies, 0.99) * 1e3, 3),
            }
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    return results


# -- memory and replay ----------------------------------------------------------------------


def measure_memory(args: argparse.Namespace) -> dict[str, float]:
    """Traced bytes of an index of ``--memory-replicas`` replicas per (block, replica) entry."""
    rng = random.Random(args.seed)
    fleet = Fleet.build(args.memory_replicas, args.blocks_per_replica, rng)
    gc.collect()
    tracemalloc.start()
    index = build_index(fleet, "prefill")
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = index.stats()
    return {
        "num_entries": stats.num_entries,
        "num_hashes": stats.num_hashes,
        "index_bytes": traced,
        "index_bytes_per_block": round(traced / stats.num_entries, 1),
    }


def measure_replay(args: argparse.Namespace) -> dict[str, float]:
    """Events per second a router's follower replays from the change log (one core)."""
    from cluster.routing.kv_index.replication import KVIndexFollower, KVIndexServer

    rng = random.Random(args.seed)
    server = KVIndexServer(max_log_entries=1 << 20, max_log_hashes=1 << 30)
    replicas = [f"r{r}" for r in range(64)]
    for replica in replicas:
        server.resync(replica, "prefill", [], 0)
    follower = KVIndexFollower()
    follower.apply_update(server.updates(None, 0))
    streams = {r: _ReplicaStream(rng, 4000) for r in replicas}
    num_events = 0
    for _ in range(40):
        for replica in replicas:
            batch = streams[replica].batch(250)
            num_events += sum(len(op.hashes) for op in batch.ops)
            server.publish(replica, [batch])
    update = server.updates(follower.epoch, follower.cursor)
    started = time.perf_counter()
    follower.apply_update(update)
    elapsed = time.perf_counter() - started
    return {"replay_events_per_s": round(num_events / elapsed)}


# -- the Ray part: shards, pumps, a router's view -------------------------------------------


class _ReplicaStream:
    """One simulated replica's events: stores of hashes new to the index and, once it holds
    ``capacity``, evictions of its oldest."""

    def __init__(self, rng: random.Random, capacity: int, stride: int = 1) -> None:
        self.rng = rng
        self.capacity = capacity
        self.stride = stride
        self.held: deque[int] = deque()
        self.seq = 0

    def batch(self, num_events: int) -> CompactBatch:
        """The next compact batch of about ``num_events`` events (the pump's wire form)."""
        num_stores = max(1, num_events // 2)
        stores = [self.rng.getrandbits(58) * self.stride for _ in range(num_stores)]
        self.held.extend(stores)
        evicted = [self.held.popleft() for _ in range(max(0, len(self.held) - self.capacity))]
        ops = [IndexOp("stored", stores, "device")]
        if evicted:
            ops.append(IndexOp("removed", evicted, "device"))
        batch = CompactBatch(self.seq, tuple(ops))
        self.seq += 1
        return batch


def start_shards(app: str, num_shards: int, replicas: Sequence[str]) -> list[Any]:
    """Fresh index shard actors of ``app``, each with its ``replicas`` registered (empty)."""
    import ray

    from cluster.routing.kv_index.actor import get_or_create_index_actor, kill_index_actor
    from cluster.routing.kv_index.shard_assignment import shard_of

    kill_index_actor(app)
    shards = [
        get_or_create_index_actor(app, shard=k, num_shards=num_shards, replica_ttl_s=600.0)
        for k in range(num_shards)
    ]
    ray.get(
        [
            shards[shard_of(r, num_shards)].resync.remote(
                to_plain(ReplicaSnapshot(r, "prefill", [], 0))
            )
            for r in replicas
        ]
    )
    return shards


def call_sizes(num_replicas: int, rates: Rates, cycle_s: float) -> list[int]:
    """Events per call of each replica of a fleet at the stated rates whose pumps each send
    once per ``cycle_s`` (prefill replicas first, in the planner's proportion)."""
    num_prefill = round(num_replicas * rates.prefill_share)
    return [
        round(
            cycle_s * (rates.prefill_events_per_s if r < num_prefill else rates.decode_events_per_s)
        )
        for r in range(num_replicas)
    ]


def measure_ingest_stream(
    num_shards: int, args: argparse.Namespace, sizes: Sequence[int]
) -> dict[str, float]:
    """Events/s (and frames/s) the shards apply when every replica streams its batches back to
    back (saturation), replica ``r`` sending ``sizes[r]`` events per frame."""
    import ray

    from cluster.routing.kv_index.actor import kill_index_actor

    app = f"cps-stream-{num_shards}"
    replicas = [f"stream-{r}" for r in range(len(sizes))]
    shards = start_shards(app, num_shards, replicas)
    endpoints = ray.get([shard.stream_endpoint.remote() for shard in shards])
    fleet: Any = ray.remote(num_cpus=0)(PumpFleet).remote()
    num_events, elapsed = ray.get(
        fleet.blast.remote(endpoints, replicas, list(sizes), args.ingest_calls, args.seed)
    )
    ray.kill(fleet)
    kill_index_actor(app)
    return {
        "events_per_s": round(num_events / elapsed),
        "calls_per_s": round(len(replicas) * args.ingest_calls / elapsed),
        "seconds": round(elapsed, 2),
    }


def measure_ingest(
    num_shards: int, args: argparse.Namespace, sizes: Sequence[int]
) -> dict[str, float]:
    """The peer: events/s (and calls/s) the shards apply through one Ray actor call per batch
    when every replica's calls are queued at once (saturation), replica ``r`` sending
    ``sizes[r]`` events per call."""
    import ray

    from cluster.routing.kv_index.actor import kill_index_actor
    from cluster.routing.kv_index.shard_assignment import shard_of

    app = f"cps-ingest-{num_shards}"
    rng = random.Random(args.seed)
    replicas = [f"ingest-{r}" for r in range(len(sizes))]
    shards = start_shards(app, num_shards, replicas)
    payloads: dict[str, list[Any]] = {}
    num_events = 0
    for replica, size in zip(replicas, sizes, strict=True):
        stream = _ReplicaStream(rng, 4 * size)
        calls = []
        for _ in range(args.ingest_calls):
            batch = stream.batch(size)
            num_events += sum(len(op.hashes) for op in batch.ops)
            calls.append([to_plain(batch)])  # inline (not through the object store)
        payloads[replica] = calls
    started = time.perf_counter()
    refs = [
        shards[shard_of(replica, num_shards)].publish.remote(replica, payloads[replica][c])
        for c in range(args.ingest_calls)
        for replica in replicas
    ]
    replies = ray.get(refs)
    elapsed = time.perf_counter() - started
    if any(reply["resync"] for reply in replies):
        raise RuntimeError("a shard asked for a resync: the ingest stream has a gap")
    kill_index_actor(app)
    return {
        "events_per_s": round(num_events / elapsed),
        "calls_per_s": round(len(refs) / elapsed),
        "seconds": round(elapsed, 2),
    }


class _AsyncStream:
    """A replica's KV event stream to its shard from an event loop (the same frames and
    answers as ``stream.StreamClient``, which a pump thread uses)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, endpoint: tuple[str, int, bytes], replica_id: str) -> _AsyncStream:
        from cluster.routing.kv_index.stream import encode_hello

        host, port, token = endpoint
        reader, writer = await asyncio.open_connection(host, port)
        stream = cls(reader, writer)
        await stream.send(encode_hello(token, replica_id))
        return stream

    async def send(self, frame: bytes) -> int:
        """Send one frame; its one-byte answer."""
        self.writer.write(frame)
        await self.writer.drain()
        reply = (await self.reader.readexactly(1))[0]
        if reply == 2:
            raise ConnectionRefusedError("the shard refused a frame")
        return reply

    def close(self) -> None:
        """Close the connection."""
        self.writer.close()


class PumpFleet:
    """Simulated replicas publishing like ``KVEventPump`` (one frame in flight on their KV
    event stream, coalescing ``FLUSH_S``), run in a Ray actor of their own so that the router's
    view (the driver) and the shards do not share its interpreter."""

    def ready(self) -> bool:
        """Answers once the actor's process is up (the run's clock starts after it)."""
        return True

    async def run(
        self,
        endpoints: list[tuple[str, int, bytes]],
        replicas: list[str],
        events_per_s: list[float],
        stride: int,
        start_at: float,
        stop_at: float,
    ) -> tuple[list[tuple[str, int, float]], int]:
        """Publish from every replica between ``start_at`` and ``stop_at``; returns each
        batch's ``(replica, seq, emitted)`` (``emitted``: when its oldest event was, on
        ``time.monotonic``, one clock per machine) and the events offered."""
        from cluster.routing.kv_index.shard_assignment import shard_of
        from cluster.routing.kv_index.stream import encode_batches

        emitted: list[tuple[str, int, float]] = []
        offered = [0]

        async def replica(name: str, rate: float, seed: int) -> None:
            rng = random.Random(seed)
            events = _ReplicaStream(rng, 4000, stride)
            stream = await _AsyncStream.open(endpoints[shard_of(name, len(endpoints))], name)
            await asyncio.sleep(max(0.0, start_at - time.monotonic()) + rng.random() * FLUSH_S)
            last = time.monotonic()
            while time.monotonic() < stop_at:
                await asyncio.sleep(FLUSH_S)
                now = time.monotonic()
                num_events = max(1, round(rate * (now - last)))
                batch = events.batch(num_events)
                emitted.append((name, batch.replica_seq, last))
                offered[0] += num_events
                last = now
                await stream.send(encode_batches([batch]))
            stream.close()

        await asyncio.gather(
            *(replica(n, r, i) for i, (n, r) in enumerate(zip(replicas, events_per_s, strict=True)))
        )
        return emitted, offered[0]

    async def blast(
        self,
        endpoints: list[tuple[str, int, bytes]],
        replicas: list[str],
        sizes: list[int],
        num_calls: int,
        seed: int,
    ) -> tuple[int, float]:
        """Every replica sends ``num_calls`` frames of ``sizes[r]`` events back to back (one
        in flight each, all replicas at once); the events sent and the seconds it took."""
        from cluster.routing.kv_index.shard_assignment import shard_of
        from cluster.routing.kv_index.stream import encode_batches

        os.nice(19)  # it stands in for replicas on other machines: the shards come first
        rng = random.Random(seed)
        frames: dict[str, list[bytes]] = {}
        num_events = 0
        for name, size in zip(replicas, sizes, strict=True):
            events = _ReplicaStream(rng, 4 * size)
            batches = [events.batch(size) for _ in range(num_calls)]
            num_events += sum(len(op.hashes) for b in batches for op in b.ops)
            frames[name] = [encode_batches([b]) for b in batches]
        streams = {
            name: await _AsyncStream.open(endpoints[shard_of(name, len(endpoints))], name)
            for name in replicas
        }

        async def send_all(name: str) -> None:
            for frame in frames[name]:
                if await streams[name].send(frame) != 0:
                    raise RuntimeError(f"replica {name}: the shard asked for a resync")

        started = time.perf_counter()
        await asyncio.gather(*(send_all(name) for name in replicas))
        elapsed = time.perf_counter() - started
        for stream in streams.values():
            stream.close()
        return num_events, elapsed


async def _router_view(
    source: Any, replicas: list[str], stop_at: float
) -> list[tuple[float, dict[str, int]]]:
    """Poll like a router every ``POLL_S``; after each poll, each replica's last applied seq."""
    views: list[tuple[float, dict[str, int]]] = []
    while time.monotonic() < stop_at:
        await source.sync_once()
        index = source.follower.index
        seqs = {name: index.last_seq(name) for name in replicas}
        views.append((time.monotonic(), {k: -1 if v is None else v for k, v in seqs.items()}))
        await asyncio.sleep(POLL_S)
    return views


def lag_run(
    num_replicas: int,
    num_shards: int,
    stride: int,
    events_per_s: list[float],
    seconds: float,
    warm_s: float = 1.0,
) -> dict[str, float]:
    """A fleet of ``num_replicas`` at ``events_per_s`` each (already divided by ``stride``)
    against ``num_shards`` shards; lag from an event's emission to the first router poll that
    shows it, after ``warm_s`` of warm-up."""
    import ray

    from cluster.routing.kv_index.actor import kill_index_actor
    from cluster.routing.kv_index.follower import ActorIndexSource
    from cluster.routing.routing_metrics import RoutingMetrics

    app = f"cps-lag-{num_replicas}-{num_shards}-{stride}"
    replicas = [f"lag-{r}" for r in range(num_replicas)]
    shards = start_shards(app, num_shards, replicas)
    fleet: Any = ray.remote(num_cpus=0)(PumpFleet).remote()
    ray.get(fleet.ready.remote())  # NOTE: a worker process can take seconds to start on 2 cores
    source = ActorIndexSource(
        app, namespace="pdserve", metrics=RoutingMetrics(), num_shards=num_shards, actors=shards
    )
    start_at = time.monotonic() + 0.5
    warm_until, stop_at = start_at + warm_s, start_at + warm_s + seconds
    endpoints = ray.get([shard.stream_endpoint.remote() for shard in shards])
    run = fleet.run.remote(endpoints, replicas, events_per_s, stride, start_at, stop_at)
    views = asyncio.run(_router_view(source, replicas, stop_at + 0.5))
    emitted, offered = ray.get(run)
    ray.kill(fleet)
    kill_index_actor(app)
    lags, unseen = _lags(emitted, views, warm_until)
    measured = [n for n, _, at in emitted if at >= warm_until]
    return {
        "replicas": num_replicas,
        "shards": num_shards,
        "stride": stride,
        "offered_events_per_s": round(offered / (stop_at - start_at)),
        "calls_per_s": round(len(measured) / seconds),
        "lag_p50_ms": round(_quantile(lags, 0.5) * 1e3, 1),
        "lag_p99_ms": round(_quantile(lags, 0.99) * 1e3, 1),
        "batches_not_seen": unseen,
    }


def _lags(
    emitted: list[tuple[str, int, float]],
    views: list[tuple[float, dict[str, int]]],
    warm_until: float,
) -> tuple[list[float], int]:
    """Per batch emitted after ``warm_until``: the time to the first view that shows it. A
    batch no view showed counts with its time to the last view (a lower bound), so a
    saturated run's quantiles are not flattered."""
    by_replica: dict[str, list[tuple[int, float]]] = {}
    for name, seq, at in emitted:
        by_replica.setdefault(name, []).append((seq, at))
    last_view_s = views[-1][0] if views else 0.0
    lags: list[float] = []
    unseen = 0
    for name, batches in by_replica.items():
        batches.sort()
        v = 0
        for seq, at in batches:  # seq and emission time grow together: one pass over views
            while v < len(views) and (views[v][1][name] < seq or views[v][0] < at):
                v += 1
            if at < warm_until:
                continue
            if v < len(views):
                lags.append(views[v][0] - at)
            else:
                unseen += 1
                lags.append(max(last_view_s - at, 0.0))
    return lags, unseen


def measure_lag(
    num_replicas: int, num_shards: int, stride: int, rates: Rates, seconds: float
) -> dict[str, float]:
    """:func:`lag_run` for a fleet at the stated rates (prefill and decode as the planner
    would split them), each replica sending its sampled hashes only."""
    num_prefill = round(num_replicas * rates.prefill_share)
    per_replica = [
        (rates.prefill_events_per_s if r < num_prefill else rates.decode_events_per_s) / stride
        for r in range(num_replicas)
    ]
    return lag_run(num_replicas, num_shards, stride, per_replica, seconds)


def sweep_capacity(
    offered: Sequence[float], num_replicas: int, seconds: float
) -> tuple[float, list[dict[str, float]]]:
    """The highest offered event rate whose lag p99 stays under ``LAG_TARGET_MS`` (one shard,
    every hash indexed), and every run."""
    runs = []
    best = 0.0
    for total in offered:
        run = lag_run(num_replicas, 1, 1, [total / num_replicas] * num_replicas, seconds)
        runs.append(run)
        if run["lag_p99_ms"] < LAG_TARGET_MS and run["batches_not_seen"] == 0:
            best = max(best, run["offered_events_per_s"])
    return best, runs


# -- the stats board ------------------------------------------------------------------------


def measure_stats_board(num_replicas: int) -> dict[str, float]:
    """CPU per ``report`` and per ``snapshot`` of the board holding ``num_replicas`` reports."""
    from cluster.serve.stats_board import StatsBoard, decode_reports
    from core.stats import ReplicaReport, ReplicaStats

    board = StatsBoard(stale_after_s=60.0)
    reports = [
        to_plain(
            ReplicaReport(
                role="prefill" if r % 7 else "decode",
                replica_id=f"r{r}",
                actor_name=f"SERVE_REPLICA::app#Prefill#r{r}",
                node_id=f"{r // 8:056x}",
                node_ip=f"10.0.{r // 256}.{r % 256}",
                pid=1000 + r,
                stats=ReplicaStats(kv_blocks_total=20_000, kv_blocks_used=r, num_running=r % 64),
            )
        )
        for r in range(num_replicas)
    ]
    started = time.perf_counter()
    for report in reports:
        board.report(report)
    report_s = (time.perf_counter() - started) / num_replicas
    started = time.perf_counter()
    snapshot = board.snapshot()
    snapshot_s = time.perf_counter() - started
    started = time.perf_counter()
    decode_reports(snapshot)
    decode_s = time.perf_counter() - started
    return {
        "report_us": round(report_s * 1e6, 1),
        "snapshot_ms": round(snapshot_s * 1e3, 2),
        "decode_snapshot_ms": round(decode_s * 1e3, 2),
        "snapshot_bytes": len(json.dumps(snapshot)),
    }


def _mean_run(runs: Sequence[dict[str, float]]) -> dict[str, Any]:
    """The mean of repeated ingest runs, with each run's events/s."""
    return {
        "events_per_s": round(statistics.fmean(r["events_per_s"] for r in runs)),
        "calls_per_s": round(statistics.fmean(r["calls_per_s"] for r in runs)),
        "runs_events_per_s": [r["events_per_s"] for r in runs],
    }


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Sequence[str]) -> int:
    """Run every measurement; print the figures and the JSON line last."""
    import ray

    args = parse_args(argv)
    rates = stated_rates()
    print(f"stated rates: {rates}", flush=True)
    replica_counts = [int(n) for n in args.replicas.split(",")]
    prompt_tokens = [int(n) for n in args.prompt_tokens.split(",")]
    route = {str(n): measure_routing(n, prompt_tokens, args) for n in replica_counts}
    print(f"route (stride 1): {json.dumps(route)}", flush=True)
    largest = str(max(replica_counts))
    route_stride = measure_routing(max(replica_counts), prompt_tokens, args, args.lag_stride)
    print(f"route (stride {args.lag_stride}) at N={largest}: {json.dumps(route_stride)}")
    memory = measure_memory(args)
    replay = measure_replay(args)
    board = measure_stats_board(args.board_replicas)
    print(f"memory: {memory}; replay: {replay}; stats board: {board}", flush=True)
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        sizes = call_sizes(args.ingest_replicas, rates, args.cycle_ms / 1e3)
        runs: dict[str, list[dict[str, float]]] = {"1": [], "2": []}
        for num_shards in (1, 2, 1, 2):  # alternated: the machine drifts between runs
            runs[str(num_shards)].append(measure_ingest_stream(num_shards, args, sizes))
        ingest = {k: _mean_run(v) for k, v in runs.items()}
        small_frames = measure_ingest_stream(1, args, [10] * args.ingest_replicas)
        print(f"ingest (streams): {ingest}; 10-event frames, 1 shard: {small_frames}")
        by_calls = {str(s): measure_ingest(s, args, sizes) for s in (1, 2)}
        small_calls = measure_ingest(1, args, [10] * args.ingest_replicas)
        print(f"ingest (actor calls): {by_calls}; 10-event calls: {small_calls}", flush=True)
        capacity, sweep = sweep_capacity(
            [float(x) for x in args.sweep.split(",")], args.sweep_replicas, args.lag_seconds / 2
        )
        print(f"lag sweep (1 shard, stride 1, {args.sweep_replicas} replicas): {sweep}")
        lag = measure_lag(
            args.lag_replicas, args.lag_shards, args.lag_stride, rates, args.lag_seconds
        )
        print(f"lag at {args.lag_replicas} replicas, stated rates: {lag}", flush=True)
    finally:
        ray.shutdown()
    key_tokens = "8192" if "8192" in route[largest] else str(prompt_tokens[-1])
    result = {
        "ingest_events_per_s_1shard": ingest["1"]["events_per_s"],
        "ingest_events_per_s_2shards": ingest["2"]["events_per_s"],
        "shard_scaling_2": round(ingest["2"]["events_per_s"] / ingest["1"]["events_per_s"], 2),
        "frames_per_s_1shard": small_frames["calls_per_s"],
        "actor_calls": {
            "ingest_events_per_s_1shard": by_calls["1"]["events_per_s"],
            "ingest_events_per_s_2shards": by_calls["2"]["events_per_s"],
            "shard_scaling_2": round(
                by_calls["2"]["events_per_s"] / by_calls["1"]["events_per_s"], 2
            ),
            "calls_per_s_1shard": small_calls["calls_per_s"],
        },
        "stream_over_actor_calls_1shard": round(
            ingest["1"]["events_per_s"] / by_calls["1"]["events_per_s"], 2
        ),
        f"route_p99_ms_8k_{largest}": route[largest][key_tokens]["p99_ms"],
        f"route_p50_ms_8k_{largest}": route[largest][key_tokens]["p50_ms"],
        "route_ms": route,
        f"route_ms_stride{args.lag_stride}_{largest}": route_stride,
        "index_bytes_per_block": memory["index_bytes_per_block"],
        "index_entries": memory["num_entries"],
        "follower_replay_events_per_s": replay["replay_events_per_s"],
        "sustained_events_per_s_1shard_lag_under_100ms": capacity,
        "lag_p99_ms": lag["lag_p99_ms"],
        "lag_p50_ms": lag["lag_p50_ms"],
        "lag_run": lag,
        "lag_sweep": sweep,
        "stated_events_per_s": {
            "prefill_replica": rates.prefill_events_per_s,
            "decode_replica": rates.decode_events_per_s,
            "prefill_share": round(rates.prefill_share, 3),
            "fleet_256": round(rates.events_per_s(256)),
            "fleet_1024": round(rates.events_per_s(1024)),
        },
        "stats_board_1024": board,
        "ingest_events_per_call": {"prefill": min(sizes), "decode": max(sizes)},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
