"""KV memory tiers: routing with a tier-aware cluster index against a device-only index and
round robin.

Two replicas of the tiny Llama, each with a small device pool and a host tier, serve a
multi-turn chat: sessions take turns round-robin, so a session's KV has left its replica's
device for the host tier by its next turn. Sessions share no system prompt by default
(``--system-tokens 0``): requests run one at a time, so the load term is zero and a shared
prefix would draw every first turn to one replica; without it the first turns spread over both
replicas (cost ties rotate), as concurrent traffic would spread them. Every engine's KV events
feed two cluster indexes in the same run: one keeps every medium (pdserve's index) and one keeps
device events only (what an index blind to offloaded KV sees). Each request is placed by the
``prefix_aware`` policy over one of them, or by ``round_robin``; no session affinity, so the
placement is the index's alone. Requests run one at a time, so TTFT is the engine's own.

Prints a table and one JSON object last with ``tier_index_hit_rate``,
``device_index_hit_rate``, ``round_robin_hit_rate``, ``hit_rate_ratio`` (tier / device-only)
and ``ttft_p50_ratio`` (tier / device-only, turns 2+).
Usage: ``python benchmarks/kv_tier_routing.py``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from cluster.routing.kv_index.index import KVIndex
from cluster.routing.policies import choose_prefix_aware, choose_round_robin
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    PoolRole,
    ReplicaLoad,
    RoutingInputs,
)
from core.config import EngineConfig, HostTierConfig, KVTiersConfig, ModelConfig
from core.hashing import hash_prompt_blocks
from core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from core.sampling import SamplingParams
from core.stats import ReplicaStats
from engine.engine import LLMEngine
from engine.setup import build_engine_parts

MODEL = "builtin:tiny-llama"
BLOCK = 16
REPLICAS = ("r0", "r1")


class Replicas:
    """Two engines whose KV events feed a full index and a device-only one."""

    def __init__(self, device_blocks: int, host_blocks: int, block_bytes: int) -> None:
        self.full, self.device_only = KVIndex(), KVIndex()
        self.engines: dict[str, LLMEngine] = {}
        tiers = KVTiersConfig(host=HostTierConfig(bytes=host_blocks * block_bytes))
        for replica_id in REPLICAS:
            for index in (self.full, self.device_only):
                index.resync(replica_id, [], 0, pool="decode")
            engine_cfg = EngineConfig(
                max_model_len=4096,
                kv_cache_memory_bytes=device_blocks * block_bytes,
                kv_tiers=tiers,
            )
            parts = build_engine_parts(
                ModelConfig(name=MODEL), engine_cfg, kv_event_callback=self._feed(replica_id)
            )
            self.engines[replica_id] = LLMEngine(parts)
        self.hash_seed = self.engines[REPLICAS[0]].scheduler.kv.hash_seed

    def _feed(self, replica_id: str) -> Callable[[KVEventBatch], None]:
        def feed(batch: KVEventBatch) -> None:
            self.full.apply(replica_id, batch)
            device = [
                e
                for e in batch.events
                if not isinstance(e, BlockStored | BlockRemoved) or e.medium == "device"
            ]
            self.device_only.apply(replica_id, KVEventBatch(batch.replica_seq, device))

        return feed

    def load(self, replica_id: str) -> ReplicaLoad:
        """The replica as a router sees it: free blocks and measured tier costs."""
        engine = self.engines[replica_id]
        stats = engine.scheduler.stats()
        rate = engine.prefill_rate
        report = ReplicaStats(
            kv_tiers=stats.kv_tiers,
            kv_block_size=BLOCK,
            prefill_tokens_total=rate.tokens_total,
            prefill_seconds_total=rate.seconds_total,
        ).routing()
        return ReplicaLoad(
            replica_id,
            num_used_blocks=stats.num_used_blocks,
            num_free_blocks=stats.num_free_blocks,
            host_block_cost=report.host_block_cost,
        )

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()


def run_alone(
    engine: LLMEngine, request_id: str, prompt: list[int], max_tokens: int
) -> tuple[float, list[int], int]:
    """TTFT, output tokens and cached prompt tokens of one request."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(request_id, prompt, params)
    ttft = None
    while True:
        for out in engine.step():
            if out.request_id != request_id:
                continue
            if ttft is None and out.outputs[0].token_ids:
                ttft = time.perf_counter() - start
            if out.finished:
                assert ttft is not None
                return ttft, list(out.outputs[0].token_ids), out.num_cached_tokens or 0


@dataclass(frozen=True)
class Result:
    hit_rate: float
    ttft_p50_s: float


def serve_chat(policy: str, args: argparse.Namespace, block_bytes: int) -> Result:
    replicas = Replicas(args.device_blocks, args.host_blocks, block_bytes)
    rng = random.Random(7)
    system = [rng.randrange(3, 250) for _ in range(args.system_tokens)]
    history = {s: list(system) for s in range(args.sessions)}
    ttfts, cached, prompt_tokens, decisions = [], 0, 0, 0
    for turn in range(args.turns):
        for session in range(args.sessions):
            prompt = history[session] + [rng.randrange(3, 250) for _ in range(args.user_tokens)]
            hashes = tuple(hash_prompt_blocks(prompt, BLOCK, seed=replicas.hash_seed))
            index = replicas.device_only if policy == "device_index" else replicas.full
            tier_hits = index.match_tiers("decode", hashes)
            inputs = RoutingInputs(
                role=PoolRole.DECODE,
                candidates=tuple(replicas.load(r) for r in REPLICAS),
                block_hashes=hashes,
                block_size=BLOCK,
                num_prompt_tokens=len(prompt),
                cache_hits={r: hit.num_blocks for r, hit in tier_hits.items()},
                tier_hits=tier_hits,
                tie_break=decisions,
            )
            decisions += 1
            decision = (
                choose_round_robin(inputs)
                if policy == "round_robin"
                else choose_prefix_aware(inputs, CostWeights(), HotSpotConfig())
            )
            engine = replicas.engines[decision.replica_id]
            ttft, answer, hit = run_alone(engine, f"s{session}-t{turn}", prompt, args.answer)
            history[session] = prompt + answer
            if turn > 0:
                ttfts.append(ttft)
            cached += hit
            prompt_tokens += len(prompt)
    for engine in replicas.engines.values():
        engine.scheduler.check_integrity()
    replicas.close()
    return Result(cached / prompt_tokens, statistics.median(ttfts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=11)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--system-tokens", type=int, default=0)
    parser.add_argument("--user-tokens", type=int, default=64)
    parser.add_argument("--answer", type=int, default=64)
    parser.add_argument("--device-blocks", type=int, default=96)
    parser.add_argument("--host-blocks", type=int, default=600)
    args = parser.parse_args()
    probe = EngineConfig(max_model_len=256, kv_cache_memory_bytes=4 << 20)
    block_bytes = build_engine_parts(ModelConfig(name=MODEL), probe).layout.block_bytes
    results = {
        p: serve_chat(p, args, block_bytes) for p in ("tier_index", "device_index", "round_robin")
    }
    print(f"{'routing':<14} {'prompt tokens hit':>18} {'turn-2+ TTFT p50':>18}")
    for name, result in results.items():
        print(f"{name:<14} {result.hit_rate:>18.3f} {result.ttft_p50_s * 1e3:>15.2f} ms")
    tier, device = results["tier_index"], results["device_index"]
    print(
        json.dumps(
            {
                "tier_index_hit_rate": round(tier.hit_rate, 3),
                "device_index_hit_rate": round(device.hit_rate, 3),
                "round_robin_hit_rate": round(results["round_robin"].hit_rate, 3),
                "hit_rate_ratio": round(tier.hit_rate / device.hit_rate, 3),
                "ttft_p50_ratio": round(tier.ttft_p50_s / device.ttft_p50_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
