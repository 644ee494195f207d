"""Hot prefixes: deliberate replication and hit-minus-load routing against prefix-aware,
an SGLang-style cache-aware router and round robin, on a simulated pool.

A simulated pool of ``--replicas`` (4) decode replicas prefilling locally, driven by pdserve's
own routing code (no Ray, no engines): the real ``KVIndex`` fed by the replicas' KV events (after
``--index-lag-ms``), the real ``choose_prefix_aware`` / ``choose_round_robin`` /
``choose_hit_minus_load`` policies and the real ``HotPrefixes`` (heat and deliberate copies).
Time is simulated: each replica prefills one request at a time, first come first served, for
``uncached tokens / --prefill-tokens-per-s + --overhead-ms``; its prefix cache is an LRU of
``--cache-blocks`` blocks (hits counted at the moment its prefill starts); the first token comes
when its prefill ends (TTFT), and the router's load for it ends then too. A deliberate copy
moves the source's blocks to the target over ``--copy-gbps`` after ``--copy-latency-ms``, never
recomputing them.

Workload (seeded): Poisson arrivals; one system prompt carries half of the requests, the other
half share ``--prefixes - 1`` other system prompts with Zipf(1) weights; each prompt is its
system prompt (``--system-tokens``) plus a unique user turn (``--user-tokens``). The default
rate puts 1.3 replicas' worth of cache-hit prefill on the hot prompt alone: more than one
replica can serve.

Policies, in the same run on the same requests:

- ``prefix_aware``: pdserve's prefix policy with the decode pool's weights and hot-spot rule,
  load counted as the serve router counts it (the whole prompt's tokens per request in flight);
- ``sglang_style``: SGLang's cache-aware rule, written from its documentation: each worker's
  approximate radix tree of the prompts routed to it, load = requests in flight; if
  ``max_load - min_load > balance_abs_threshold`` and ``max_load > min_load *
  balance_rel_threshold`` the shortest queue, else the longest prefix match when the match rate
  exceeds ``cache_threshold``, else the worker with the smallest tree (defaults 64, 1.5, 0.3);
- ``round_robin``;
- ``hot_prefix``: hit minus load in seconds with heat and deliberate copies.

Two scenarios, each policy on the same requests: the hot prompt at its full share from the
start (``--hot-ramp-s``, default 0), and the same workload with the hot prompt's share ramping
up over ``--copy-ramp-s`` (10 s), so it starts on one holder and its heat outgrows it: the
scenario where deliberate copies are made. Prints a table for each, then one JSON line last:
``ttft_p99_ratio_vs_prefix`` and ``ttft_p99_ratio_vs_sglang_style`` (hot_prefix's TTFT p99 over
theirs) and ``hit_rate_ratio_vs_prefix`` (hot_prefix's prefix hit rate over prefix_aware's) of
the first, ``bytes_copied_per_request`` of hot_prefix in the second, and every policy's
figures in both (``policies``, ``ramp_policies``). Usage:
``python benchmarks/hot_prefix.py [--requests N]``.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import json
import random
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cluster.routing.hit_minus_load import choose_hit_minus_load
from cluster.routing.hot_prefixes import HotPrefixes
from cluster.routing.kv_index.index import KVIndex
from cluster.routing.policies import choose_prefix_aware, choose_round_robin
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    PoolRole,
    ReplicaLoad,
    RoutingDecision,
    RoutingInputs,
    RoutingReason,
)
from core.config import HotPrefixConfig
from core.hashing import BlockHash, hash_prompt_blocks
from core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from core.messages import WarmPrefixRequest

POOL = "decode"
BLOCK_SIZE = 16
POLICIES = ("prefix_aware", "sglang_style", "round_robin", "hot_prefix")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--prefixes", type=int, default=8, help="System prompts, the hot one too.")
    p.add_argument("--system-tokens", type=int, default=1024)
    p.add_argument("--user-tokens", type=int, default=64)
    p.add_argument("--prefill-tokens-per-s", type=float, default=16000.0)
    p.add_argument("--overhead-ms", type=float, default=4.0, help="Per request, hit or miss.")
    p.add_argument(
        "--hot-load", type=float, default=1.3, help="The hot prompt's hit work, in replicas."
    )
    p.add_argument(
        "--hot-ramp-s",
        type=float,
        default=0.0,
        help="The hot prompt's share grows from 0 to half over this long (0: half at once).",
    )
    p.add_argument(
        "--copy-ramp-s",
        type=float,
        default=10.0,
        help="The second scenario's --hot-ramp-s: a hot prompt that needs copies.",
    )
    p.add_argument("--cache-blocks", type=int, default=400, help="Per replica.")
    p.add_argument("--block-bytes", type=int, default=2 * 2**20, help="An 8B model's block.")
    p.add_argument("--copy-gbps", type=float, default=10.0, help="GB/s of a KV copy.")
    p.add_argument("--copy-latency-ms", type=float, default=5.0)
    p.add_argument("--index-lag-ms", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


@dataclass(frozen=True)
class Request:
    """One prompt of the workload."""

    request_id: str
    arrival_s: float
    prefix_id: int
    block_hashes: tuple[BlockHash, ...]
    num_tokens: int


def workload(args: argparse.Namespace) -> list[Request]:
    """Poisson arrivals over the Zipf mix of system prompts (see the module docstring)."""
    rng = random.Random(args.seed)
    systems = [
        [rng.randrange(1, 30000) for _ in range(args.system_tokens)] for _ in range(args.prefixes)
    ]
    others = [1.0 / rank for rank in range(1, args.prefixes)]
    hit_s = args.user_tokens / args.prefill_tokens_per_s + args.overhead_ms / 1000
    rate_per_s = 2 * args.hot_load / hit_s
    requests, now_s = [], 0.0
    for i in range(args.requests):
        now_s += rng.expovariate(rate_per_s)
        ramp = min(1.0, now_s / args.hot_ramp_s) if args.hot_ramp_s > 0 else 1.0
        weights = [ramp * sum(others), *others]  # the hot prompt: half of all requests
        prefix_id = rng.choices(range(args.prefixes), weights)[0]
        prompt = systems[prefix_id] + [rng.randrange(1, 30000) for _ in range(args.user_tokens)]
        hashes = tuple(hash_prompt_blocks(prompt, BLOCK_SIZE))
        requests.append(Request(f"req-{i}", now_s, prefix_id, hashes, len(prompt)))
    return requests


@dataclass
class Replica:
    """A simulated replica: an LRU prefix cache and a first-come-first-served prefill server."""

    replica_id: str
    capacity_blocks: int
    cache: OrderedDict[BlockHash, None] = field(default_factory=OrderedDict)
    queue: deque[Request] = field(default_factory=deque)
    busy: bool = False
    seq: int = 0
    prefill_tokens_total: int = 0
    prefill_seconds_total: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Measured as a replica reports it: tokens computed over their prefill time."""
        if not self.prefill_tokens_total:
            return None
        return self.prefill_tokens_total / self.prefill_seconds_total

    def leading_hits(self, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of ``hashes`` in the cache (refreshed as recently used)."""
        num = 0
        for block_hash in hashes:
            if block_hash not in self.cache:
                break
            self.cache.move_to_end(block_hash)
            num += 1
        return num

    def store(self, hashes: Sequence[BlockHash]) -> KVEventBatch:
        """Cache ``hashes`` (LRU eviction); the KV events that says so."""
        new = [h for h in hashes if h not in self.cache]
        for block_hash in hashes:
            self.cache[block_hash] = None
            self.cache.move_to_end(block_hash)
        evicted = []
        while len(self.cache) > self.capacity_blocks:
            evicted.append(self.cache.popitem(last=False)[0])
        events: list[BlockStored | BlockRemoved] = []
        if new:
            events.append(BlockStored(new, None, [0] * (len(new) * BLOCK_SIZE), BLOCK_SIZE))
        if evicted:
            events.append(BlockRemoved(evicted))
        batch = KVEventBatch(self.seq, list(events))
        self.seq += 1
        return batch


class Router:
    """One policy's view: the KV index and the load it routed and has not seen finish."""

    def __init__(self, policy: str, replica_ids: Sequence[str], args: argparse.Namespace) -> None:
        self.policy = policy
        self.replica_ids = list(replica_ids)
        self.index = KVIndex()
        for replica_id in replica_ids:
            self.index.resync(replica_id, [], 0, pool=POOL)
        self.tokens = dict.fromkeys(replica_ids, 0)
        self.requests = dict.fromkeys(replica_ids, 0)
        self.placed: dict[str, tuple[str, int]] = {}
        self.num_decisions = 0
        self.config = HotPrefixConfig(prefill_tokens_per_s=args.prefill_tokens_per_s)
        self.hot = HotPrefixes(self.config, POOL)
        self.sglang = SGLangStyle(replica_ids, args.cache_blocks)

    def route(
        self,
        request: Request,
        now_s: float,
        block_bytes: int,
        measured: dict[str, float | None],
    ) -> str:
        """Place ``request`` (``measured``: each replica's reported prefill tokens per
        second); returns the replica id."""
        inputs = RoutingInputs(
            role=PoolRole.DECODE,
            candidates=tuple(
                ReplicaLoad(
                    r,
                    num_active_tokens=self.tokens[r],
                    num_running_requests=n,
                    prefill_tokens_per_s=measured[r],
                )
                for r, n in self.requests.items()
            ),
            block_hashes=request.block_hashes,
            block_size=BLOCK_SIZE,
            num_prompt_tokens=request.num_tokens,
            cache_hits={
                r: hit.num_blocks
                for r, hit in self.index.match_tiers(POOL, request.block_hashes).items()
            },
            now_s=now_s,
            tie_break=self.num_decisions,
        )
        self.num_decisions += 1
        decision = self._decide(inputs, request)
        replica_id = decision.replica_id
        # the serve router's count: whole prompt for prefix_aware's decode pool, else the work
        num_tokens = request.num_tokens
        if self.policy == "hot_prefix":
            num_tokens -= decision.num_cached_blocks * BLOCK_SIZE
            self.hot.placed(request.request_id, inputs, num_tokens, now_s, block_bytes)
        self.tokens[replica_id] += num_tokens
        self.requests[replica_id] += 1
        self.placed[request.request_id] = (replica_id, num_tokens)
        return replica_id

    def _decide(self, inputs: RoutingInputs, request: Request) -> RoutingDecision:
        if self.policy == "prefix_aware":
            weights = CostWeights.for_role(PoolRole.DECODE)
            return choose_prefix_aware(inputs, weights, HotSpotConfig())
        if self.policy == "round_robin":
            return choose_round_robin(inputs)
        if self.policy == "hot_prefix":
            return choose_hit_minus_load(inputs, self.config)[0]
        replica_id = self.sglang.choose(request.block_hashes, self.requests)
        return RoutingDecision(replica_id, RoutingReason.CACHE_HIT, (replica_id,))

    def finished(self, request_id: str) -> None:
        """The request's first token came: its load leaves the router's count."""
        replica_id, num_tokens = self.placed.pop(request_id)
        self.tokens[replica_id] -= num_tokens
        self.requests[replica_id] -= 1
        self.hot.finished(request_id)


class SGLangStyle:
    """SGLang's cache-aware rule (see the module docstring), over approximate trees: the
    blocks of the prompts routed to each worker, LRU-bounded like the worker's cache."""

    def __init__(
        self,
        worker_ids: Sequence[str],
        max_tree_blocks: int,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        self.trees = {w: OrderedDict[BlockHash, None]() for w in worker_ids}
        self.max_tree_blocks = max_tree_blocks
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold

    def choose(self, hashes: Sequence[BlockHash], loads: dict[str, int]) -> str:
        """The worker for a prompt of ``hashes``, given requests in flight per worker."""
        max_load, min_load = max(loads.values()), min(loads.values())
        if (
            max_load - min_load > self.balance_abs_threshold
            and max_load > min_load * self.balance_rel_threshold
        ):
            chosen = min(loads, key=loads.__getitem__)
        else:
            matches = {w: self._match(tree, hashes) for w, tree in self.trees.items()}
            best = max(matches, key=matches.__getitem__)
            if hashes and matches[best] / len(hashes) > self.cache_threshold:
                chosen = best
            else:
                chosen = min(self.trees, key=lambda w: len(self.trees[w]))
        tree = self.trees[chosen]
        for block_hash in hashes:
            tree[block_hash] = None
            tree.move_to_end(block_hash)
        while len(tree) > self.max_tree_blocks:
            tree.popitem(last=False)
        return chosen

    @staticmethod
    def _match(tree: OrderedDict[BlockHash, None], hashes: Sequence[BlockHash]) -> int:
        return next((i for i, h in enumerate(hashes) if h not in tree), len(hashes))


@dataclass
class Outcome:
    """One policy's run."""

    ttfts_s: list[float] = field(default_factory=list)
    num_prompt_blocks: int = 0
    num_hit_blocks: int = 0
    num_copies: int = 0
    bytes_copied: int = 0


def simulate(policy: str, requests: Sequence[Request], args: argparse.Namespace) -> Outcome:
    """Run ``requests`` through the pool under ``policy`` (an event loop on simulated time)."""
    ids = [f"r{i}" for i in range(args.replicas)]
    replicas = {r: Replica(r, args.cache_blocks) for r in ids}
    router = Router(policy, ids, args)
    outcome = Outcome()
    events: list[tuple[float, int, Callable[[float], object]]] = []
    order = itertools.count()

    def at(time_s: float, action: Callable[[float], object]) -> None:
        heapq.heappush(events, (time_s, next(order), action))

    def publish(replica_id: str, batch: KVEventBatch, t: float) -> None:
        at(t + args.index_lag_ms / 1000, lambda _: router.index.apply(replica_id, batch))

    def start_next(replica: Replica, t: float) -> None:
        if replica.busy or not replica.queue:
            return
        request = replica.queue.popleft()
        replica.busy = True
        num_hit = replica.leading_hits(request.block_hashes)
        outcome.num_prompt_blocks += len(request.block_hashes)
        outcome.num_hit_blocks += num_hit
        num_uncached = request.num_tokens - num_hit * BLOCK_SIZE
        prefill_s = num_uncached / args.prefill_tokens_per_s + args.overhead_ms / 1000
        replica.prefill_tokens_total += num_uncached
        replica.prefill_seconds_total += prefill_s
        done_s = t + prefill_s
        at(done_s, lambda t2: finish(replica, request, t2))

    def finish(replica: Replica, request: Request, t: float) -> None:
        replica.busy = False
        outcome.ttfts_s.append(t - request.arrival_s)
        router.finished(request.request_id)
        publish(replica.replica_id, replica.store(request.block_hashes), t)
        start_next(replica, t)

    def copy(warm: WarmPrefixRequest, t: float) -> None:
        source, target = replicas[warm.source_replica_id], replicas[warm.target_replica_id]
        blocks = warm.block_hashes[: source.leading_hits(warm.block_hashes)]
        if not blocks:
            return
        num_bytes = len(blocks) * args.block_bytes
        outcome.num_copies += 1
        outcome.bytes_copied += num_bytes
        landed_s = t + args.copy_latency_ms / 1000 + num_bytes / (args.copy_gbps * 1e9)
        at(landed_s, lambda t2: publish(target.replica_id, target.store(blocks), t2))

    def arrive(request: Request, t: float) -> None:
        measured = {r: replica.prefill_tokens_per_s for r, replica in replicas.items()}
        replica = replicas[router.route(request, t, args.block_bytes, measured)]
        for warm in router.hot.take_warm_requests():
            copy(warm, t)
        replica.queue.append(request)
        start_next(replica, t)

    for request in requests:
        at(request.arrival_s, functools.partial(arrive, request))
    while events:
        time_s, _, action = heapq.heappop(events)
        action(time_s)
    return outcome


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(outcome: Outcome, num_requests: int) -> dict[str, float]:
    """One policy's figures."""
    return {
        "ttft_p50_ms": round(quantile(outcome.ttfts_s, 0.5) * 1000, 2),
        "ttft_p99_ms": round(quantile(outcome.ttfts_s, 0.99) * 1000, 2),
        "hit_rate": round(outcome.num_hit_blocks / max(outcome.num_prompt_blocks, 1), 4),
        "copies": outcome.num_copies,
        "bytes_copied_per_request": round(outcome.bytes_copied / num_requests),
    }


def run_policies(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every policy on the same requests of ``args``' workload; prints the table."""
    requests = workload(args)
    results = {
        policy: summary(simulate(policy, requests, args), len(requests)) for policy in POLICIES
    }
    print(f"{'policy':<14}{'ttft p50 ms':>12}{'ttft p99 ms':>12}{'hit rate':>10}{'copies':>8}")
    for policy, r in results.items():
        print(
            f"{policy:<14}{r['ttft_p50_ms']:>12}{r['ttft_p99_ms']:>12}{r['hit_rate']:>10}"
            f"{r['copies']:>8}"
        )
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Run every policy in both scenarios; print the tables and the JSON line."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(
        f"scenario 1: the hot prompt at its full share at once (--hot-ramp-s {args.hot_ramp_s:g})"
    )
    results = run_policies(args)
    ramp_args = argparse.Namespace(**{**vars(args), "hot_ramp_s": args.copy_ramp_s})
    print(f"scenario 2: the hot prompt's share ramps up over {args.copy_ramp_s:g} s")
    ramped = run_policies(ramp_args)
    hot = results["hot_prefix"]
    report: dict[str, object] = {
        "ttft_p99_ratio_vs_prefix": round(
            hot["ttft_p99_ms"] / results["prefix_aware"]["ttft_p99_ms"], 3
        ),
        "ttft_p99_ratio_vs_sglang_style": round(
            hot["ttft_p99_ms"] / results["sglang_style"]["ttft_p99_ms"], 3
        ),
        "hit_rate_ratio_vs_prefix": round(hot["hit_rate"] / results["prefix_aware"]["hit_rate"], 3),
        # from the ramp, where the hot prompt starts on one holder and copies are made
        "bytes_copied_per_request": ramped["hot_prefix"]["bytes_copied_per_request"],
        "requests": args.requests,
        "policies": results,
        "ramp_policies": ramped,
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
