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

``--faults control-plane`` (with ``--minutes 20``) also kills a piece of the control plane every
``--fault-every-s`` (``benchmarks/soak_faults.py``: the KV index, the stats board, Serve's
controller, the ingress replica, the prefill replica, in turn) and half the prompts share one of
a few long prefixes, so prefix routing has something to find. Then also:

* ``requests_lost`` counts only losses outside a killed ingress; ``requests_lost_in_ingress``
  those in flight in the ingress replica when it was killed (the bound: they die with it,
  dropped or answered with a bare 500 by Serve's proxy);
* ``faults``: each fault's kind, time and ``recovery_s``; ``max_recovery_s`` per kind;
* ``prefix_hit_rate_recovery_s``: after each KV index kill, seconds until the decode pool's
  routing prefix hit rate was back to 90% of what it was before (target <= 10); the worst one.

Prints one JSON object last. Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/soak.py
[--faults control-plane --minutes 20]``.
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
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from cluster.ops.launcher import deploy
from cluster.ops.ray_session import start_local_ray
from cluster.serve.config_file import load_cluster_config
from core.config import RayClusterConfig
from engine.builtin import resolve_model

if TYPE_CHECKING:
    from benchmarks.soak_faults import ControlPlaneFaults

MODEL, SERVED, APP = "builtin:tiny-llama", "tiny-llama", "bench-soak"
PROXY_ERROR = "500:not-openai-shaped"
"""What Serve's proxy answers for a request whose ingress replica died under it."""
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
    p.add_argument("--minutes", type=float, help="Run length in minutes (overrides --duration-s).")
    p.add_argument("--faults", choices=("none", "control-plane"), default="none")
    p.add_argument("--fault-every-s", type=float, default=120.0)
    p.add_argument(
        "--shared-prefix-fraction",
        type=float,
        help="Prompts that start with one of a few long prefixes (default 0.5 with --faults).",
    )
    args = p.parse_args(argv)
    if args.minutes is not None:
        args.duration_s = args.minutes * 60.0
    if args.shared_prefix_fraction is None:
        args.shared_prefix_fraction = 0.5 if args.faults != "none" else 0.0
    return args


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
    started_s: float = 0.0
    ended_s: float = 0.0


PREFIXES = [" ".join(random.Random(seed).choice(WORDS) for _ in range(120)) for seed in range(4)]
"""Long shared prefixes (a few system prompts): prompts that start with one can hit a cache."""


def _prompt(rng: random.Random, long: bool, shared_fraction: float) -> str:
    if rng.random() < shared_fraction:
        return rng.choice(PREFIXES) + " " + " ".join(rng.choice(WORDS) for _ in range(8))
    count = rng.randint(60, 150) if long else rng.randint(2, 5)  # ~5 tokens a word here
    return " ".join(rng.choice(WORDS) for _ in range(count))


async def one_request(
    http: httpx.AsyncClient, url: str, rng: random.Random, cancel: bool, shared_fraction: float
) -> Outcome:
    body = {"model": SERVED, "prompt": _prompt(rng, rng.random() < 0.5, shared_fraction),
            "max_tokens": rng.randint(8, 64), "temperature": 0, "ignore_eos": True,
            "stream": rng.random() < 0.5}  # fmt: skip
    outcome = Outcome(cancelled=cancel, started_s=time.perf_counter())
    task = asyncio.ensure_future(_send(http, url, body, outcome))
    if cancel:
        await asyncio.sleep(rng.uniform(0.0, 2.0))
        if not task.done():
            task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    outcome.ended_s = time.perf_counter()
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


def scrape(endpoint: str) -> list[str]:
    """The lines of one ``/metrics`` read."""
    return httpx.get(f"{endpoint}/metrics", timeout=30).text.splitlines()


def kv_in_use(lines: list[str]) -> tuple[float, float, float]:
    """(KV blocks used, exports pinned, transfers in flight) summed over the pools."""
    values = {"pdserve:kv_blocks_used": 0.0, "pdserve:kv_exports_pinned": 0.0,
              "pdserve:transfer_in_flight": 0.0}  # fmt: skip
    for line in lines:
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return tuple(values.values())  # type: ignore[return-value]


@dataclass
class Run:
    """What one soak run observed."""

    outcomes: list[Outcome]
    samples: list[tuple[float, float]]
    """(seconds into the run, KV blocks in use)."""
    routing: list[tuple[float, float, float]]
    """(seconds into the run, decode pool's cached blocks, prompt blocks) routing totals."""
    started: float
    faults: ControlPlaneFaults | None = None
    """The control-plane faults that ran (``--faults control-plane``)."""


def routing_totals(lines: list[str]) -> tuple[float, float]:
    """The decode pool's routing (cached blocks, prompt blocks) totals."""
    cached = prompt = 0.0
    for line in lines:
        if line.startswith('pdserve:routing_cached_blocks_total{pool="decode'):
            cached += float(line.rsplit(" ", 1)[1])
        elif line.startswith('pdserve:routing_prompt_blocks_total{pool="decode'):
            prompt += float(line.rsplit(" ", 1)[1])
    return cached, prompt


async def drive(args: argparse.Namespace, endpoint: str, dashboard_url: str) -> Run:
    rng = random.Random(args.seed)
    started = time.perf_counter()
    run = Run([], [], [], started)

    async def sampler() -> None:
        while True:
            try:
                lines = await asyncio.to_thread(scrape, endpoint)
                (used, _, _), (cached, prompt) = kv_in_use(lines), routing_totals(lines)
            except (httpx.HTTPError, ValueError):  # the ingress is being replaced
                await asyncio.sleep(1.0)
                continue
            now = time.perf_counter() - started
            run.samples.append((now, used))
            run.routing.append((now, cached, prompt))
            await asyncio.sleep(1.0)

    timeout = httpx.Timeout(120.0, connect=30.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        watch = asyncio.create_task(sampler())
        faulting = None
        if args.faults == "control-plane":
            from benchmarks.soak_faults import ControlPlaneFaults

            run.faults = ControlPlaneFaults(APP, endpoint, dashboard_url)
            stop_at_s = args.duration_s - min(60.0, args.fault_every_s / 2)
            faulting = asyncio.create_task(run.faults.run(args.fault_every_s, stop_at_s, started))
        tasks = []
        while time.perf_counter() - started < args.duration_s:
            cancel = rng.random() < args.cancel_fraction
            url = f"{endpoint}/v1/completions"
            request = one_request(
                http, url, random.Random(rng.random()), cancel, args.shared_prefix_fraction
            )
            tasks.append(asyncio.create_task(request))
            await asyncio.sleep(rng.expovariate(args.rate))
        run.outcomes = list(await asyncio.gather(*tasks))
        if faulting is not None:
            await faulting
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    return run


def drift(samples: list[tuple[float, float]], total_blocks: float) -> float:
    """Slope of blocks in use over the middle three fifths, as a fraction of the cache/min."""
    if len(samples) < 5 or total_blocks <= 0:
        return 0.0
    t = np.asarray([s[0] for s in samples])
    y = np.asarray([s[1] for s in samples])
    keep = (t >= t[-1] * 0.2) & (t <= t[-1] * 0.8)
    slope = float(np.polyfit(t[keep], y[keep], 1)[0]) if keep.sum() >= 3 else 0.0
    return slope * 60.0 / total_blocks


def total_kv_blocks(lines: list[str]) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("pdserve:kv_blocks_total"))  # fmt: skip


def fault_keys(run: Run, in_ingress: list[Outcome]) -> dict[str, Any]:
    """The ``--faults`` keys: each fault's recovery, the worst per kind, the prefix hit rate's
    recovery after each index kill, and the losses inside killed ingress replicas."""
    if run.faults is None:
        return {}
    from benchmarks.soak_faults import hit_rate_recovery_s

    records = run.faults.records
    worst: dict[str, float | None] = {}
    for record in records:
        seen = worst.get(record.kind, 0.0)
        worst[record.kind] = (
            None if seen is None or record.recovery_s is None else max(seen, record.recovery_s)
        )
    hit_recoveries = [
        hit_rate_recovery_s(run.routing, record.at_s)
        for record in records
        if record.kind == "kv_index"
    ]
    known = [r for r in hit_recoveries if r is not None]
    return {
        "requests_lost_in_ingress": len(in_ingress),
        "faults": [
            {
                "kind": r.kind,
                "at_s": round(r.at_s, 1),
                "what": r.what,
                "recovery_s": None if r.recovery_s is None else round(r.recovery_s, 2),
            }
            for r in records
        ],
        "max_recovery_s": {k: None if v is None else round(v, 2) for k, v in worst.items()},
        "prefix_hit_rate_recovery_s": (
            max(known) if known and len(known) == len(hit_recoveries) else None
        ),
        "prefix_hit_rate_recoveries_s": hit_recoveries,
    }


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    resolve_model(MODEL)
    session = start_local_ray(RayClusterConfig(address="local", num_cpus=8))
    try:
        endpoint = deploy(load_cluster_config(config(args)), session.dashboard_url)
        before = kv_in_use(scrape(endpoint))
        run = asyncio.run(drive(args, endpoint, session.dashboard_url))
        outcomes, samples = run.outcomes, run.samples
        deadline = time.monotonic() + args.drain_s
        after = kv_in_use(scrape(endpoint))
        while time.monotonic() < deadline and any(after):
            time.sleep(0.5)
            after = kv_in_use(scrape(endpoint))
        total = total_kv_blocks(scrape(endpoint))
    finally:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    kept = [o for o in outcomes if not o.cancelled]
    records = run.faults.records if run.faults else []
    ingress_kills = [run.started + r.at_s for r in records if r.kind == "ingress"]
    in_ingress = [  # dropped, or answered by Serve's proxy (not by pdserve) as it died
        o
        for o in kept
        if (o.lost is not None or o.error == PROXY_ERROR)
        and any(o.started_s <= t <= o.ended_s for t in ingress_kills)
    ]
    inside = {id(o) for o in in_ingress}
    lost = [o.lost for o in kept if o.lost is not None and id(o) not in inside]
    errors = Counter(o.error for o in kept if o.error is not None and id(o) not in inside)
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
        **fault_keys(run, in_ingress),
    }
    print(f"{result['requests']} requests ({result['cancelled']} cancelled), "
          f"{result['completed']} completed, lost {result['requests_lost']}, leaked "
          f"{result['kv_blocks_leaked']} blocks, drift {result['kv_usage_drift']}/min")  # fmt: skip
    print(json.dumps(result))
    recovered = all(r.recovery_s is not None for r in records)
    return 0 if result["kv_blocks_leaked"] == 0 and not lost and recovered else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
