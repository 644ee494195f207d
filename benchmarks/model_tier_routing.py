"""Model tiers (cheap-model routing): a mixed workload served all-to-large against
``model: auto``, one run.

One Ray, one Serve app serving two models: ``small`` (builtin:tiny-llama, dense, colocated) and
``large`` (builtin:mid-moe, a MoE with one prefill and one decode replica). The virtual model
``auto`` sends a request to ``large`` when its prompt is long, when it carries the header
``x-pdserve-tier: hard`` or when its last user message says "prove" or "derive"; everything else
goes to ``small``. The workload (seeded) is mostly short easy chats plus long-prompt, hinted and
"prove" requests; every one of the latter three is *hard* (a rule is meant to catch it). The
same requests are sent twice, Poisson arrivals, streamed: pass A names ``large`` for each, pass B
names ``auto``. Cost is counted as an operator pays it: every prefilled and generated token at
the answering model's active parameters per token, read from the checkpoints. Every request is
greedy with ``ignore_eos``, so its token counts (and the cost ratio) follow from the workload
alone; a long prompt costs as much as ~6 easy chats, so the ratio rises with the long share and
falls with the easy answers' length (128 tokens by default; with 32 it is ~0.71).

The last stdout line is one JSON object with ``cost_ratio`` (routed / all-to-large),
``hard_to_large_share`` (hard requests that ``large`` answered in pass B), the share of requests
and TTFT p50/p99 per model and pass, the total costs and the failures.

    .venv/bin/python benchmarks/model_tier_routing.py --output /tmp/model_tier_routing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ray
from ray import serve

from cluster.serve.app_builder import build_app_from_config
from cluster.serve.config_file import load_cluster_config
from engine.builtin import resolve_model
from loadtest.routed_client import RoutedRequest, run_poisson, send_routed
from loadtest.text import TextSynthesizer
from loadtest.tiered_cost import RoutedOutcome, pass_summary, share_answered_by
from loadtest.tokens import load_token_counter
from sizer.model_dir import load_model_shape

CHECKPOINTS = {"small": "builtin:tiny-llama", "large": "builtin:mid-moe"}
APP = "tiered"
HARD_REGEX = r"(?i)\b(prove|derive)\b"
KINDS = ("easy", "long", "hinted", "regex")

logger = logging.getLogger(__name__)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--rate", type=float, default=4.0, help="Mean arrivals per second.")
    p.add_argument("--long-threshold", type=int, default=512, help="long_prompt rule tokens.")
    p.add_argument("--long-fraction", type=float, default=0.10)
    p.add_argument("--hinted-fraction", type=float, default=0.10, help="x-pdserve-tier: hard.")
    p.add_argument("--regex-fraction", type=float, default=0.05, help='Saying "prove".')
    p.add_argument("--short-prompt-tokens", type=int, default=32)
    p.add_argument("--short-output-tokens", type=int, default=128, help="Easy answers' length.")
    p.add_argument("--long-prompt-tokens", type=int, default=1024)
    p.add_argument("--long-output-tokens", type=int, default=16)
    p.add_argument("--port", type=int, default=8124)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="Also write the JSON to this file.")
    return p.parse_args(argv)


def cluster_config(args: argparse.Namespace) -> dict[str, Any]:
    """The pdserve config: small colocated, large disaggregated, and the virtual ``auto``."""
    pool = {"num_cpus": 1.0, "max_ongoing_requests": 64}
    large_rules = [
        {"name": "long_prompt", "min_prompt_tokens": args.long_threshold},
        {"name": "hinted_hard", "header": "x-pdserve-tier", "header_value": "hard"},
        {"name": "hard_words", "message_regex": HARD_REGEX},
    ]
    return {
        "models": [
            {
                "model": {"name": CHECKPOINTS["small"], "dtype": "float32", "served_name": "small"},
                "prefill": {"num_replicas": 0},
                "decode": {**pool, "num_replicas": 1},
            },
            {
                "model": {"name": CHECKPOINTS["large"], "dtype": "float32", "served_name": "large"},
                "prefill": {**pool, "num_replicas": 1},
                "decode": {**pool, "num_replicas": 1},
            },
        ],
        "virtual_models": [
            {
                "name": "auto",
                "default": "small",
                "rules": [{"model": "large", **r} for r in large_rules],
            }
        ],
        "engine": {
            "max_model_len": 4096,
            "kv_cache_memory_bytes": 64 * 1024 * 1024,
            "max_num_batched_tokens": 512,
            "max_num_seqs": 32,
        },
        "transfer": {"bind_host": "127.0.0.1"},
        "server": {"port": args.port, "num_cpus": 0.25, "max_in_flight_requests": 1024},
        "cluster": {"address": "auto", "app_name": APP},
    }


def build_workload(args: argparse.Namespace) -> list[RoutedRequest]:
    """Exact class counts from the fractions, in a seeded random order; texts are random words
    of the stated token counts (the "prove" ones start with "Prove that")."""
    synth = TextSynthesizer(load_token_counter(None, CHECKPOINTS["small"]))
    rng = np.random.default_rng(args.seed)
    fractions = {"long": args.long_fraction, "hinted": args.hinted_fraction}
    counts = {kind: round(args.num_requests * f) for kind, f in fractions.items()}
    counts["regex"] = round(args.num_requests * args.regex_fraction)
    counts["easy"] = args.num_requests - sum(counts.values())
    if counts["easy"] < 0:
        raise SystemExit("the long, hinted and regex fractions add up to more than 1")
    kinds = [kind for kind in KINDS for _ in range(counts[kind])]
    rng.shuffle(kinds)
    requests = []
    for i, kind in enumerate(kinds):
        long = kind == "long"
        text, _ = synth.make(args.long_prompt_tokens if long else args.short_prompt_tokens, rng)
        if kind == "regex":
            text = "Prove that" + text
        elif re.search(HARD_REGEX, text):
            raise SystemExit(f"request {i} ({kind}) says prove/derive by chance: change --seed")
        max_tokens = args.long_output_tokens if long else args.short_output_tokens
        headers = {"x-pdserve-tier": "hard"} if kind == "hinted" else {}
        requests.append(RoutedRequest(f"req-{i}", kind, text, max_tokens, kind != "easy", headers))
    return requests


async def measure(
    args: argparse.Namespace, requests: list[RoutedRequest]
) -> dict[str, list[RoutedOutcome]]:
    """Warm both models up (a long and three short requests each), then pass A (all to
    ``large``) and pass B (``auto``)."""
    base_url = f"http://127.0.0.1:{args.port}"
    warm = [r for r in requests if r.kind == "long"][:1] + list(requests[:3])
    async with httpx.AsyncClient(timeout=600) as http:
        for model in ("small", "large"):
            outcomes = await asyncio.gather(*(send_routed(http, base_url, r, model) for r in warm))
            if any(not o.ok for o in outcomes):
                raise RuntimeError(f"warm-up of {model} failed: {[o.error for o in outcomes]}")
        passes = {}
        for name, model in (("all_to_large", "large"), ("routed", "auto")):
            start_s = time.perf_counter()
            passes[name] = await run_poisson(
                http, base_url, requests, model, rate=args.rate, seed=args.seed
            )
            logger.info("pass %s took %.1f s", name, time.perf_counter() - start_s)
    return passes


def deploy(args: argparse.Namespace) -> None:
    """Run the app and wait until both models answer."""
    serve.run(
        build_app_from_config(load_cluster_config(cluster_config(args))), name=APP, route_prefix="/"
    )
    deadline = time.monotonic() + 300
    for model in ("small", "large"):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        while True:
            try:
                url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
                if httpx.post(url, json=body, timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"model {model!r} did not start serving")
            time.sleep(0.5)


def report(
    args: argparse.Namespace,
    requests: Sequence[RoutedRequest],
    passes: dict[str, list[RoutedOutcome]],
    active_params: dict[str, int],
) -> dict[str, Any]:
    """Both passes' summaries and the headline numbers."""
    summaries = {name: pass_summary(outcomes, active_params) for name, outcomes in passes.items()}
    base, routed = summaries["all_to_large"]["total_cost"], summaries["routed"]["total_cost"]
    return {
        "benchmark": "model_tier_routing",
        "settings": {k: v for k, v in vars(args).items() if k not in ("port", "output")},
        "models": CHECKPOINTS,
        "active_params": active_params,
        "workload": {kind: sum(1 for r in requests if r.kind == kind) for kind in KINDS},
        "num_hard": sum(1 for r in requests if r.hard),
        **summaries,
        "requests_failed": sum(s["failed"] for s in summaries.values()),
        "easy_to_small_share": share_answered_by(passes["routed"], "small", hard=False),
        "hard_to_large_share": share_answered_by(passes["routed"], "large", hard=True),
        "cost_ratio": routed / base if base else None,
    }


def print_summary(output: dict[str, Any]) -> None:
    """A few human-readable lines on stderr."""
    for name in ("all_to_large", "routed"):
        summary = output[name]
        print(
            f"{name}: cost {summary['total_cost']:.4g}, failed {summary['failed']}", file=sys.stderr
        )
        for model, m in summary["models"].items():
            ttft = f"TTFT p50 {m['p50_ttft_ms']:.0f} ms, p99 {m['p99_ttft_ms']:.0f} ms"
            print(f"  {model}: {m['share']:.0%} of requests, {ttft}", file=sys.stderr)
    print(
        f"cost_ratio {output['cost_ratio']:.3f}, hard_to_large_share "
        f"{output['hard_to_large_share']}, easy_to_small_share {output['easy_to_small_share']}",
        file=sys.stderr,
    )


def main(argv: Sequence[str]) -> int:
    """Deploy, warm up, run both passes and print the JSON (last line)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    start_s = time.perf_counter()
    for checkpoint in CHECKPOINTS.values():
        resolve_model(checkpoint)  # written once, before replicas race for it
    active_params = {m: load_model_shape(c).num_active_params for m, c in CHECKPOINTS.items()}
    requests = build_workload(args)
    ray.init(
        num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        deploy(args)
        passes = asyncio.run(measure(args, requests))
    finally:
        serve.shutdown()
        ray.shutdown()
    output = report(args, requests, passes, active_params)
    output["wall_s"] = time.perf_counter() - start_s
    print_summary(output)
    if args.output:
        Path(args.output).write_text(json.dumps(output, indent=2) + "\n")
    print(json.dumps(output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
