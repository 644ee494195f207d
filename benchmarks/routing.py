"""Prefix-aware routing vs round-robin on a shared-prefix, multi-turn workload.

One run, same machine, same Ray, same engine options: the app (2 prefill replicas, 1 decode) is
deployed with ``routing.policy: prefix_aware``, driven, torn down, then deployed again with
``round_robin`` and driven with the same requests. The workload: ``--groups`` shared document
prefixes, each used by ``--sessions-per-group`` conversations of ``--turns`` turns; a turn's
prompt is the document plus every earlier turn plus a new one. The prefill KV budget is sized
so the distinct blocks of the workload are several times one prefill replica's capacity
(``working_set_over_capacity`` in the output). Prompts are token-id lists, so block boundaries
are exact. Prints one JSON line: per policy the prefix hit rate (cached over prompt tokens,
from the responses' usage, and the routers' own per-pool figure), TTFT p50/p99, the busiest
prefill replica's share of requests and the routing decision p50; and the ratios
``hit_rate_ratio`` and ``ttft_p50_ratio`` (prefix_aware over round_robin).

    .venv/bin/python benchmarks/routing.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import ray
from ray import serve

from cluster.routing.kv_index.actor import kill_index_actor
from cluster.routing.routing_metrics import RoutingSnapshot
from cluster.serve.app_builder import build_app_from_config
from cluster.serve.config_file import load_cluster_config
from cluster.serve.pool_options import BOARD_DEPLOYMENT, INGRESS_DEPLOYMENT
from core.codec import from_plain
from engine.builtin import resolve_model
from engine.models import ModelArchConfig

MODEL = "builtin:tiny-moe"
SERVED = "tiny-moe"
BLOCK_SIZE = 16
POLICIES = ("prefix_aware", "round_robin")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=4, help="Shared document prefixes.")
    p.add_argument("--prefix-tokens", type=int, default=768)
    p.add_argument("--sessions-per-group", type=int, default=3)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--turn-tokens", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=4)
    p.add_argument("--prefill-kv-blocks", type=int, default=128, help="Per prefill replica.")
    p.add_argument("--num-prefill", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--port", type=int, default=8124)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


@dataclass(frozen=True)
class Turn:
    """One request of the workload."""

    session_id: str
    prompt: list[int]


def workload(args: argparse.Namespace) -> list[list[Turn]]:
    """Waves of requests: wave ``t`` holds turn ``t`` of every session (shuffled, seeded)."""
    rng = random.Random(args.seed)

    def tokens(num_tokens: int) -> list[int]:
        return [rng.randrange(10, 250) for _ in range(num_tokens)]

    prefixes = [tokens(args.prefix_tokens) for _ in range(args.groups)]
    histories = {
        f"g{g}-s{s}": list(prefixes[g])
        for g in range(args.groups)
        for s in range(args.sessions_per_group)
    }
    waves = []
    for _ in range(args.turns):
        wave = []
        for session_id, history in histories.items():
            history.extend(tokens(args.turn_tokens))
            wave.append(Turn(session_id, list(history)))
        rng.shuffle(wave)
        waves.append(wave)
    return waves


def working_set_blocks(waves: list[list[Turn]]) -> int:
    """Distinct full blocks over all prompts (chained: a block is its whole prefix)."""
    seen = set()
    for wave in waves:
        for turn in wave:
            for end in range(BLOCK_SIZE, len(turn.prompt) + 1, BLOCK_SIZE):
                seen.add(tuple(turn.prompt[:end]))
    return len(seen)


def cluster_config(args: argparse.Namespace, policy: str, app: str) -> dict[str, Any]:
    """The app of one policy (everything else identical)."""
    arch = ModelArchConfig.from_dir(resolve_model(MODEL))
    block_bytes = arch.kv_layout(MODEL, "float32", BLOCK_SIZE, 0).block_bytes
    pool = {"num_cpus": 1.0, "max_ongoing_requests": 64}
    return {
        "model": {"name": MODEL, "dtype": "float32", "served_name": SERVED},
        "engine": {
            "block_size": BLOCK_SIZE,
            "max_model_len": 2048,
            "kv_cache_memory_bytes": 64 * 1024 * 1024,
            "max_num_batched_tokens": 512,
            "max_num_seqs": 16,
        },
        "prefill": {
            **pool,
            "num_replicas": args.num_prefill,
            "engine": {"kv_cache_memory_bytes": args.prefill_kv_blocks * block_bytes},
        },
        "decode": {**pool, "num_replicas": 1},
        "transfer": {"bind_host": "127.0.0.1"},
        "routing": {"policy": policy},
        "disaggregation": {"local_prefill_threshold_tokens": 16},
        "server": {"port": args.port, "num_cpus": 0.25, "max_in_flight_requests": 1024},
        "cluster": {"address": "auto", "app_name": app},
    }


@dataclass
class Outcome:
    """What one request measured."""

    ttft_s: float
    num_prompt_tokens: int
    num_cached_tokens: int


async def send(http: httpx.AsyncClient, url: str, turn: Turn, args: argparse.Namespace) -> Outcome:
    """One streamed completion: time to the first token event, and its usage."""
    body = {
        "model": SERVED,
        "prompt": turn.prompt,
        "max_tokens": args.output_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": turn.session_id,
    }
    started_s = time.perf_counter()
    ttft_s, usage = None, None
    async with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if ttft_s is None and event.get("choices"):
                ttft_s = time.perf_counter() - started_s
            usage = event.get("usage") or usage
    if ttft_s is None or usage is None:
        raise RuntimeError("the stream had no token or no usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Outcome(ttft_s, int(usage["prompt_tokens"]), int(cached))


async def drive(waves: list[list[Turn]], args: argparse.Namespace) -> list[Outcome]:
    """Each wave with ``--concurrency`` requests in flight; waves one after another."""
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    limit = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(timeout=300) as http:

        async def one(turn: Turn) -> Outcome:
            async with limit:
                return await send(http, url, turn, args)

        outcomes = []
        for wave in waves:
            outcomes += await asyncio.gather(*(one(turn) for turn in wave))
        return outcomes


def prefill_requests(app: str) -> dict[str, int]:
    """``requests_total`` of each prefill replica, once the board's reports stopped moving."""
    board = serve.get_deployment_handle(BOARD_DEPLOYMENT, app)

    def read() -> dict[str, int]:
        reports = board.snapshot.remote().result(timeout_s=30)
        return {r["replica_id"]: int(r["stats"]["requests_total"]) for r in reports["prefill"]}

    last = read()
    for _ in range(20):
        time.sleep(1.2)  # NOTE: a benchmark, not a test: the board reports every 0.5 s
        now = read()
        if now == last:
            return now
        last = now
    return last


def deploy(config: dict[str, Any], app: str, args: argparse.Namespace) -> None:
    """Run the app and wait until every prefill replica reports and a request completes."""
    serve.run(build_app_from_config(load_cluster_config(config)), name=app, route_prefix="/")
    board = serve.get_deployment_handle(BOARD_DEPLOYMENT, app)
    deadline = time.monotonic() + 300
    while len(board.snapshot.remote().result(timeout_s=30).get("prefill", [])) < args.num_prefill:
        if time.monotonic() > deadline:
            raise RuntimeError("prefill replicas did not report")
        time.sleep(0.5)


def run_policy(policy: str, args: argparse.Namespace, waves: list[list[Turn]]) -> dict[str, Any]:
    """Deploy with ``policy``, warm up, drive the waves, tear down; the policy's figures."""
    app = f"routing-{policy.replace('_', '-')}"
    deploy(cluster_config(args, policy, app), app, args)
    try:
        warm_rng = random.Random(args.seed + 1)
        warm = [[Turn(f"w{i}", [warm_rng.randrange(10, 250) for _ in range(96)])] for i in range(4)]
        asyncio.run(drive(warm, args))
        before = prefill_requests(app)
        started_s = time.perf_counter()
        outcomes = asyncio.run(drive(waves, args))
        duration_s = time.perf_counter() - started_s
        after = prefill_requests(app)
        ingress = serve.get_deployment_handle(INGRESS_DEPLOYMENT, app)
        routing = from_plain(
            RoutingSnapshot, ingress.routing_snapshot.remote().result(timeout_s=30)
        )
        board = serve.get_deployment_handle(BOARD_DEPLOYMENT, app).snapshot.remote().result()
        capacity = min(int(r["stats"]["kv_blocks_total"]) for r in board["prefill"])
    finally:
        serve.delete(app)
        kill_index_actor(app)
    per_replica = [after[r] - before.get(r, 0) for r in after]
    ttfts_ms = np.array([o.ttft_s * 1e3 for o in outcomes])
    pools = routing.pools
    return {
        "num_requests": len(outcomes),
        "duration_s": duration_s,
        "hit_rate": sum(o.num_cached_tokens for o in outcomes)
        / max(1, sum(o.num_prompt_tokens for o in outcomes)),
        "routing_hit_rate": {pool: m.prefix_hit_rate for pool, m in pools.items()},
        "p50_ttft_ms": float(np.percentile(ttfts_ms, 50)),
        "p99_ttft_ms": float(np.percentile(ttfts_ms, 99)),
        "p50_ttft_ms_by_hit": _ttft_by_hit(outcomes),
        "prefill_requests_per_replica": sorted(per_replica, reverse=True),
        "busiest_replica_share": max(per_replica) / max(1, sum(per_replica)),
        "routing_p50_ms": {p: m.decision_latency_s.p50 * 1e3 for p, m in pools.items()},
        "decisions": {pool: m.decisions_total for pool, m in pools.items()},
        "prefill_capacity_blocks": capacity,
    }


def _ttft_by_hit(outcomes: Sequence[Outcome]) -> dict[str, float | None]:
    """TTFT p50 of requests with at least half their prompt cached vs the rest."""
    split: dict[str, list[float]] = {"hit": [], "miss": []}
    for o in outcomes:
        hit = o.num_cached_tokens * 2 >= o.num_prompt_tokens
        split["hit" if hit else "miss"].append(o.ttft_s * 1e3)
    return {k: float(np.percentile(v, 50)) if v else None for k, v in split.items()}


def main(argv: Sequence[str]) -> int:
    """Run both policies and print the comparison as one JSON line."""
    args = parse_args(argv)
    resolve_model(MODEL)  # writes the built-in checkpoint once, before any replica races for it
    waves = workload(args)
    ray.init(
        num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        results = {policy: run_policy(policy, args, waves) for policy in POLICIES}
    finally:
        serve.shutdown()
        ray.shutdown()
    pa, rr = results["prefix_aware"], results["round_robin"]
    output = {
        "benchmark": "routing",
        "settings": {k: v for k, v in vars(args).items() if k != "port"},
        "working_set_blocks": working_set_blocks(waves),
        "working_set_over_capacity": working_set_blocks(waves) / pa["prefill_capacity_blocks"],
        **results,
        "hit_rate_ratio": pa["hit_rate"] / rr["hit_rate"] if rr["hit_rate"] else None,
        "ttft_p50_ratio": pa["p50_ttft_ms"] / rr["p50_ttft_ms"],
        "busiest_share_ratio": pa["busiest_replica_share"] / rr["busiest_replica_share"],
        "prefix_aware_routing_p50_ms": pa["routing_p50_ms"].get("prefill"),
    }
    print(json.dumps(output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
