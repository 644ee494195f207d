"""Soak: an abort-heavy mixed workload against a local cluster; nothing may leak or be lost.

For ``--duration-s`` requests arrive (Poisson, ``--rate`` per second): long prompts (remote
prefill, a KV transfer) and short ones (local prefill on decode), streamed or not; half are
cancelled by the client at a random moment (before the first token, mid-prefill, mid-transfer,
mid-stream). Every second the KV blocks in use are read from ``/metrics``. The peer is the
cluster itself at rest: after the run the KV in use must drain to what it held before the first
request (0), with no export pinned and no transfer in flight.

* ``kv_blocks_leaked``: KV blocks still in use (plus exports still pinned) once the cluster had
  ``--drain-s`` to settle; must be 0.
* ``requests_lost``: requests the client did not cancel that ended without a complete answer
  or an OpenAI-shaped error (a dropped connection, a stream without ``[DONE]``, a timeout).
* ``kv_usage_drift``: the slope of KV blocks in use over the steady middle of the run (its
  first and last fifth left out), as a fraction of the cache per minute; ~0 when nothing leaks.
* ``errors_by_reason``: OpenAI error types (and HTTP statuses) of the requests that got one.

Prints one JSON object last. Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/soak.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from cluster.ops.launcher import deploy
from cluster.ops.ray_session import start_local_ray
from cluster.serve.config_file import load_cluster_config
from core.config import RayClusterConfig
from engine.builtin import resolve_model

MODEL, SERVED, APP = "builtin:tiny-llama", "tiny-llama", "bench-soak"
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
         "wizards", "quietly", "hex")  # fmt: skip


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=120.0)
    p.add_argument("--rate", type=float, default=3.0, help="Arrivals per second.")
    p.add_argument("--cancel-fraction", type=float, default=0.5)
    p.add_argument("--drain-s", type=float, default=60.0)
    p.add_argument("--port", type=int, default=8133)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": {"name": MODEL, "dtype": "float32", "served_name": SERVED},
        "engine": {
            "max_model_len": 1024,
            "kv_cache_memory_bytes": 16 << 20,
            "max_num_batched_tokens": 256,
            "max_num_seqs": 16,
        },
        "prefill": {"num_replicas": 1, "num_cpus": 0.5},
        "decode": {"num_replicas": 1, "num_cpus": 0.5},
        "transfer": {"bind_host": "127.0.0.1", "lease_s": 10.0},
        "disaggregation": {"local_prefill_threshold_tokens": 32},
        "server": {"port": args.port, "num_cpus": 0.25, "max_in_flight_requests": 64},
        "cluster": {"address": "auto", "app_name": APP},
    }


@dataclass
class Outcome:
    cancelled: bool = False
    ok: bool = False
    error: str | None = None
    lost: str | None = None


def _prompt(rng: random.Random, long: bool) -> str:
    count = rng.randint(60, 150) if long else rng.randint(2, 5)  # ~5 tokens a word here
    return " ".join(rng.choice(WORDS) for _ in range(count))


async def one_request(
    http: httpx.AsyncClient, url: str, rng: random.Random, cancel: bool
) -> Outcome:
    body = {"model": SERVED, "prompt": _prompt(rng, rng.random() < 0.5),
            "max_tokens": rng.randint(8, 64), "temperature": 0, "ignore_eos": True,
            "stream": rng.random() < 0.5}  # fmt: skip
    outcome = Outcome(cancelled=cancel)
    task = asyncio.ensure_future(_send(http, url, body, outcome))
    if cancel:
        await asyncio.sleep(rng.uniform(0.0, 2.0))
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return outcome
    await asyncio.gather(task, return_exceptions=True)
    return outcome


async def _send(http: httpx.AsyncClient, url: str, body: dict[str, Any], outcome: Outcome) -> None:
    try:
        if not body["stream"]:
            response = await http.post(url, json=body)
            _judge_status(response.status_code, response.content, outcome)
            return
        async with http.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                _judge_status(response.status_code, await response.aread(), outcome)
                return
            done = False
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"error"' in line[:20]:
                    outcome.error = _error_type(line[6:].encode())
                done = done or line == "data: [DONE]"
            if outcome.error is None:
                outcome.ok = done
                outcome.lost = None if done else "stream ended without [DONE]"
    except httpx.HTTPError as e:
        outcome.lost = f"{type(e).__name__}"


def _judge_status(status: int, content: bytes, outcome: Outcome) -> None:
    if status == 200:
        outcome.ok = True
    else:
        outcome.error = f"{status}:{_error_type(content)}"


def _error_type(content: bytes) -> str:
    try:
        return str(json.loads(content)["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return "not-openai-shaped"


def kv_in_use(endpoint: str) -> tuple[float, float, float]:
    """(KV blocks used, exports pinned, transfers in flight) summed over the pools."""
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    values = {"pdserve:kv_blocks_used": 0.0, "pdserve:kv_exports_pinned": 0.0,
              "pdserve:transfer_in_flight": 0.0}  # fmt: skip
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return tuple(values.values())  # type: ignore[return-value]


async def drive(args: argparse.Namespace, endpoint: str) -> tuple[list[Outcome], list[tuple]]:
    rng = random.Random(args.seed)
    samples: list[tuple[float, float]] = []
    started = time.perf_counter()

    async def sampler() -> None:
        while True:
            used, _, _ = await asyncio.to_thread(kv_in_use, endpoint)
            samples.append((time.perf_counter() - started, used))
            await asyncio.sleep(1.0)

    timeout = httpx.Timeout(120.0, connect=30.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        watch = asyncio.create_task(sampler())
        tasks = []
        while time.perf_counter() - started < args.duration_s:
            cancel = rng.random() < args.cancel_fraction
            url = f"{endpoint}/v1/completions"
            tasks.append(
                asyncio.create_task(one_request(http, url, random.Random(rng.random()), cancel))
            )
            await asyncio.sleep(rng.expovariate(args.rate))
        outcomes = list(await asyncio.gather(*tasks))
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    return outcomes, samples


def drift(samples: list[tuple[float, float]], total_blocks: float) -> float:
    """Slope of blocks in use over the middle three fifths, as a fraction of the cache/min."""
    if len(samples) < 5 or total_blocks <= 0:
        return 0.0
    t = np.asarray([s[0] for s in samples])
    y = np.asarray([s[1] for s in samples])
    keep = (t >= t[-1] * 0.2) & (t <= t[-1] * 0.8)
    slope = float(np.polyfit(t[keep], y[keep], 1)[0]) if keep.sum() >= 3 else 0.0
    return slope * 60.0 / total_blocks


def total_kv_blocks(endpoint: str) -> float:
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("pdserve:kv_blocks_total"))  # fmt: skip


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    resolve_model(MODEL)
    session = start_local_ray(RayClusterConfig(address="local", num_cpus=8))
    try:
        endpoint = deploy(load_cluster_config(config(args)), session.dashboard_url)
        before = kv_in_use(endpoint)
        outcomes, samples = asyncio.run(drive(args, endpoint))
        deadline = time.monotonic() + args.drain_s
        after = kv_in_use(endpoint)
        while time.monotonic() < deadline and any(after):
            time.sleep(0.5)
            after = kv_in_use(endpoint)
        total = total_kv_blocks(endpoint)
    finally:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    kept = [o for o in outcomes if not o.cancelled]
    errors = Counter(o.error for o in kept if o.error is not None)
    lost = [o.lost for o in kept if o.lost is not None]
    result = {
        "benchmark": "soak",
        "settings": {k: v for k, v in vars(args).items() if k != "port"},
        "requests": len(outcomes),
        "cancelled": len(outcomes) - len(kept),
        "completed": sum(o.ok for o in kept),
        "kv_blocks_before": before[0],
        "kv_blocks_peak": max((s[1] for s in samples), default=0.0),
        "kv_blocks_total": total,
        "kv_blocks_leaked": after[0] + after[1],
        "transfers_in_flight_after": after[2],
        "requests_lost": len(lost),
        "lost_reasons": dict(Counter(lost)),
        "kv_usage_drift": round(drift(samples, total), 5),
        "errors_by_reason": dict(errors),
    }
    print(f"{result['requests']} requests ({result['cancelled']} cancelled), "
          f"{result['completed']} completed, lost {result['requests_lost']}, leaked "
          f"{result['kv_blocks_leaked']} blocks, drift {result['kv_usage_drift']}/min")  # fmt: skip
    print(json.dumps(result))
    return 0 if result["kv_blocks_leaked"] == 0 and not lost else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
