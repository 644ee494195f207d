"""Disaggregated (1 prefill + 1 decode replica) vs colocated (2 replicas doing both) serving.

One run, same machine, same Ray, same engine options: each mode is deployed in turn through
the real stack (Serve ingress -> pools), warmed up, and driven by the load tester with the
same mixed workload — a fraction of long-prompt requests (prefill-heavy) among short chatty
ones (decode-heavy), Poisson arrivals. The colocated mode is pdserve with no prefill replica
and two decode replicas: every request prefills locally with chunked prefill
(``max_num_batched_tokens``), interleaved with the other requests' decode steps. Prints JSON:
TTFT and inter-token latency p50/p99 (overall and per request class) and goodput at the stated
SLO for both modes, plus their ratios.

    .venv/bin/python benchmarks/disagg_vs_colocated.py --num-requests 48 --rate 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ray
from ray import serve

from cluster.serve.app_builder import build_app_from_config
from cluster.serve.config_file import load_cluster_config
from engine.builtin import resolve_model
from loadtest.config import ArrivalConfig, LoadTestTargetConfig, RandomWorkloadConfig, SloConfig
from loadtest.http_client import OpenAIStreamClient
from loadtest.session_driver import run_sessions
from loadtest.summary import summarize
from loadtest.text import TextSynthesizer
from loadtest.tokens import load_token_counter
from loadtest.types import RequestRecord, Session
from loadtest.workloads import build_sessions

MODEL = "builtin:tiny-moe"
APP = "bench"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--rate", type=float, default=2.0, help="Mean arrivals per second.")
    p.add_argument("--long-fraction", type=float, default=0.25)
    p.add_argument("--long-prompt-tokens", type=int, default=1024)
    p.add_argument("--long-output-tokens", type=int, default=16)
    p.add_argument("--short-prompt-tokens", type=int, default=32)
    p.add_argument("--short-output-tokens", type=int, default=64)
    p.add_argument("--chunk-tokens", type=int, default=256, help="max_num_batched_tokens.")
    p.add_argument("--local-prefill-threshold", type=int, default=64)
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=25.0)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="Also write the JSON to this file.")
    return p.parse_args(argv)


def cluster_config(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """The pdserve config of one mode (the engine options are identical in both)."""
    disagg = mode == "disaggregated"
    pool = {"num_cpus": 1.0, "max_ongoing_requests": 64}
    return {
        "model": {"name": MODEL, "dtype": "float32", "served_name": "tiny-moe"},
        "engine": {
            "max_model_len": 4096,
            "kv_cache_memory_bytes": 64 * 1024 * 1024,
            "max_num_batched_tokens": args.chunk_tokens,
            "max_num_seqs": 32,
        },
        "prefill": {**pool, "num_replicas": 1 if disagg else 0},
        "decode": {**pool, "num_replicas": 1 if disagg else 2},
        "transfer": {"bind_host": "127.0.0.1"},
        "disaggregation": {"local_prefill_threshold_tokens": args.local_prefill_threshold},
        "server": {"port": args.port, "num_cpus": 0.25, "max_in_flight_requests": 1024},
        "cluster": {"address": "auto", "app_name": APP},
    }


def mixed_sessions(args: argparse.Namespace) -> list[Session]:
    """Long-prompt and short sessions interleaved at random (seeded), numbered in order."""
    counter = load_token_counter(None, MODEL)
    synth = TextSynthesizer(counter)
    num_long = round(args.num_requests * args.long_fraction)

    def workload(prompt: int, output: int) -> RandomWorkloadConfig:
        return RandomWorkloadConfig.model_validate(
            {"input_len": {"tokens": prompt}, "output_len": {"tokens": output}}
        )

    long = build_sessions(workload(args.long_prompt_tokens, args.long_output_tokens), synth, 1)
    short = build_sessions(workload(args.short_prompt_tokens, args.short_output_tokens), synth, 2)
    kinds = np.array([1] * num_long + [0] * (args.num_requests - num_long))
    np.random.default_rng(args.seed).shuffle(kinds)
    return [
        replace(next(long) if kind else next(short), session_id=i) for i, kind in enumerate(kinds)
    ]


def deploy(config: dict[str, Any], endpoint: str) -> None:
    """Run the mode's app and wait until it completes a request (``/ready`` wants a prefill
    replica, which the colocated mode has none of)."""
    serve.run(build_app_from_config(load_cluster_config(config)), name=APP, route_prefix="/")
    body = {"model": "tiny-moe", "prompt": "warm up", "max_tokens": 2}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{endpoint}/v1/completions", json=body, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the app did not start serving")


async def drive(sessions: list[Session], args: argparse.Namespace, endpoint: str) -> Any:
    """Warm up, then send the sessions; the load tester's run result."""
    target = LoadTestTargetConfig.model_validate(
        {"base_url": endpoint, "model": "tiny-moe", "ignore_eos": True, "temperature": 0.0}
    )
    arrivals = ArrivalConfig.model_validate(
        {"request_rate": args.rate, "num_requests": len(sessions), "seed": args.seed}
    )
    counter = load_token_counter(None, MODEL)
    async with httpx.AsyncClient(timeout=600) as http:
        client = OpenAIStreamClient(http, target, "tiny-moe")
        warmup = ArrivalConfig.model_validate({"num_requests": 4, "max_concurrency": 2})
        await run_sessions(sessions[:4], warmup, client, counter)
        return await run_sessions(sessions, arrivals, client, counter)


def report(records: Sequence[RequestRecord], duration_s: float, slo: SloConfig) -> dict[str, Any]:
    """Summary fields that matter here: TTFT / ITL p50 + p99, goodput, failures."""
    summary = summarize(records, duration_s, slo, percentiles=(50.0, 99.0))
    keys = ("completed", "failed", "request_throughput", "request_goodput", "output_throughput")
    picked = {k: summary[k] for k in keys}
    for metric in ("ttft", "itl", "tpot"):
        for p in ("p50", "p99"):
            picked[f"{p}_{metric}_ms"] = summary.get(f"{p}_{metric}_ms")
    picked["goodput_fraction"] = (
        summary["request_goodput"] * duration_s / len(records) if records else 0.0
    )
    return picked


def run_mode(mode: str, args: argparse.Namespace, sessions: list[Session]) -> dict[str, Any]:
    """Deploy ``mode``, drive the workload, tear it down; its report."""
    endpoint = f"http://127.0.0.1:{args.port}"
    deploy(cluster_config(args, mode), endpoint)
    try:
        result = asyncio.run(drive(sessions, args, endpoint))
    finally:
        serve.delete(APP)
    slo = SloConfig.model_validate({"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms})
    records = result.records
    long_ids = {s.session_id for s in sessions if s.turns[0].text_tokens > args.short_prompt_tokens}
    return {
        "all": report(records, result.duration_s, slo),
        "long_prompt": report(
            [r for r in records if r.session_id in long_ids], result.duration_s, slo
        ),
        "short_prompt": report(
            [r for r in records if r.session_id not in long_ids], result.duration_s, slo
        ),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` when both are known and ``b`` is non-zero."""
    return None if a is None or b in (None, 0) else a / b


def main(argv: Sequence[str]) -> int:
    """Run both modes and print the comparison as JSON."""
    args = parse_args(argv)
    resolve_model(MODEL)  # writes the built-in checkpoint once, before any replica races for it
    sessions = mixed_sessions(args)
    ray.init(
        num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        results = {mode: run_mode(mode, args, sessions) for mode in ("disaggregated", "colocated")}
    finally:
        serve.shutdown()
        ray.shutdown()
    d, c = results["disaggregated"]["all"], results["colocated"]["all"]
    output = {
        "benchmark": "disagg_vs_colocated",
        "settings": {k: v for k, v in vars(args).items() if k not in ("port", "output")},
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms},
        **results,
        "disaggregated_over_colocated": {
            k: ratio(d[k], c[k])
            for k in ("p50_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p99_itl_ms", "request_goodput")
        },
    }
    text = json.dumps(output, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
