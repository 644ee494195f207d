"""Long-context interference: disaggregated (1 prefill + 1 decode) vs colocated (2 replicas).

One run, same machine, same Ray, same engine options (configs/local-long-context.yaml): each
mode is deployed in turn through the real stack and driven by the load tester with the same
long-short mix — short chat requests at a steady Poisson rate, and long-context prompts
(32K tokens by default) arriving back to back early in the run, the way a batch of documents
lands on a RAG service. Colocated is that config with ``prefill.num_replicas: 0`` and two
decode replicas (every prompt prefills on a decode replica, chunked, between decode steps);
disaggregated is the config as written. The question is what the long prompts do to the
*short* requests: their TTFT and ITL percentiles (all short requests, and those while a long
prompt prefills, from the load tester's ``interference`` section). Prints a summary per mode,
then, as its last line, one JSON object with ``short_ttft_p99_ratio`` and
``short_itl_p99_ratio`` (disaggregated / colocated) and ``long_prompts_completed``.

    .venv/bin/python benchmarks/long_context.py
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
import ray
from ray import serve

from cluster.app import build_app_from_config
from cluster.serve.config_file import REPO_CONFIGS, load_cluster_config
from core.config.files import read_yaml_mapping
from engine.builtin import resolve_model
from loadtest.bench import prepare_sessions
from loadtest.config import ArrivalConfig, LoadTestTargetConfig, SloConfig
from loadtest.flags import validate
from loadtest.http_client import OpenAIStreamClient
from loadtest.interference import interference_summary
from loadtest.session_driver import RunResult, run_sessions
from loadtest.summary import summarize
from loadtest.tokens import TokenCounter, load_token_counter
from loadtest.types import Session

APP = "long-context-bench"
MODES = ("disaggregated", "colocated")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO_CONFIGS / "local-long-context.yaml"))
    p.add_argument("--num-requests", type=int, default=60, help="Long and short together.")
    p.add_argument("--num-long", type=int, default=2)
    p.add_argument("--first-long-index", type=int, default=2, help="Requests before the longs.")
    p.add_argument("--rate", type=float, default=0.5, help="Mean arrivals per second.")
    p.add_argument("--long-prompt-tokens", type=int, default=32768)
    p.add_argument("--long-output-tokens", type=int, default=8)
    p.add_argument("--short-prompt-tokens", type=int, default=256, help="Uniform +-50%%.")
    p.add_argument("--short-output-tokens", type=int, default=32)
    p.add_argument("--port", type=int, default=8131)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="Also write the full JSON to this file.")
    return p.parse_args(argv)


def mode_config(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """The long-context config, on this run's Ray and port, with the mode's replica layout."""
    config = read_yaml_mapping(Path(args.config), kind="cluster config", param="config")
    config["cluster"] = {"address": "auto", "app_name": APP}
    config["server"] = {**config.get("server", {}), "port": args.port}
    if mode == "colocated":
        config["prefill"] = {**config.get("prefill", {}), "num_replicas": 0}
        config["decode"] = {**config.get("decode", {}), "num_replicas": 2}
    return config


def mixed_sessions(args: argparse.Namespace, counter: TokenCounter) -> list[Session]:
    """The long-short mix, with its long requests moved back to back after the first few."""
    workload = {
        "kind": "long-short-mix",
        "long_fraction": args.num_long / args.num_requests,
        "long_input_len": {"distribution": "fixed", "tokens": args.long_prompt_tokens},
        "long_output_len": {"distribution": "fixed", "tokens": args.long_output_tokens},
        "short_input_len": {
            "distribution": "uniform",
            "tokens": args.short_prompt_tokens,
            "range_ratio": 0.5,
        },
        "short_output_len": {"distribution": "fixed", "tokens": args.short_output_tokens},
    }
    arrivals = {"num_requests": args.num_requests, "seed": args.seed}
    config = validate({"workload": workload, "arrivals": arrivals}, "long_context benchmark")
    sessions = prepare_sessions(config, counter)
    longs = [s for s in sessions if s.label == "long"]
    shorts = [s for s in sessions if s.label != "long"]
    first = args.first_long_index
    ordered = shorts[:first] + longs + shorts[first:]
    return [replace(s, session_id=i) for i, s in enumerate(ordered)]


def deploy(config: dict[str, Any], endpoint: str, served_name: str) -> None:
    """Run the mode's app and wait until it completes a request."""
    serve.run(build_app_from_config(load_cluster_config(config)), name=APP, route_prefix="/")
    body = {"model": served_name, "prompt": "warm up", "max_tokens": 2}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{endpoint}/v1/completions", json=body, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the app did not start serving")


async def drive(
    sessions: list[Session],
    args: argparse.Namespace,
    endpoint: str,
    served_name: str,
    counter: TokenCounter,
) -> RunResult:
    """Warm up on a few short requests, then send the mix; the load tester's run result."""
    target = LoadTestTargetConfig.model_validate(
        {"base_url": endpoint, "model": served_name, "ignore_eos": True, "temperature": 0.0}
    )
    arrivals = ArrivalConfig.model_validate(
        {"request_rate": args.rate, "num_requests": len(sessions), "seed": args.seed}
    )
    async with httpx.AsyncClient(timeout=3600) as http:
        client = OpenAIStreamClient(http, target, served_name)
        shorts = [s for s in sessions if s.label == "short"][:4]
        warmup = ArrivalConfig.model_validate({"num_requests": 4, "max_concurrency": 2})
        await run_sessions(shorts, warmup, client, counter)
        return await run_sessions(sessions, arrivals, client, counter)


def run_mode(
    mode: str, args: argparse.Namespace, sessions: list[Session], counter: TokenCounter
) -> dict[str, Any]:
    """Deploy ``mode``, drive the mix, tear it down; its interference section and summary."""
    endpoint = f"http://127.0.0.1:{args.port}"
    config = mode_config(args, mode)
    served_name = config["model"].get("served_name") or config["model"]["name"]
    deploy(config, endpoint, served_name)
    started = time.monotonic()
    try:
        result = asyncio.run(drive(sessions, args, endpoint, served_name, counter))
    finally:
        serve.delete(APP)
    summary = summarize(result.records, result.duration_s, SloConfig.model_validate({}))
    interference = interference_summary(result.records) or {}
    return {
        "wall_s": time.monotonic() - started,
        "completed": summary["completed"],
        "failed": summary["failed"],
        "failure_reasons": summary["failure_reasons"],
        "long_prompt_tokens": sorted(r.prompt_tokens for r in result.records if r.label == "long"),
        "long_ttft_s": sorted(r.ttft_s for r in result.records if r.label == "long" and r.success),
        "interference": interference,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` when both are known and ``b`` is non-zero."""
    return None if a is None or b in (None, 0) else a / b


def _p99s(section: dict[str, Any]) -> dict[str, Any]:
    return {"ttft": section["p99_ttft_ms"], "itl": section["p99_itl_ms"]}


def headline(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The comparison the benchmark is for (disaggregated / colocated), plus the settings."""
    d, c = (results[m]["interference"] for m in MODES)
    short, during = "short_all", "short_during_long_prefill"
    return {
        "benchmark": "long_context",
        "short_ttft_p99_ratio": ratio(d[short]["p99_ttft_ms"], c[short]["p99_ttft_ms"]),
        "short_itl_p99_ratio": ratio(d[short]["p99_itl_ms"], c[short]["p99_itl_ms"]),
        "short_ttft_p99_during_long_prefill_ratio": ratio(
            d[during]["p99_ttft_ms"], c[during]["p99_ttft_ms"]
        ),
        "short_itl_p99_during_long_prefill_ratio": ratio(
            d[during]["p99_itl_ms"], c[during]["p99_itl_ms"]
        ),
        "long_prompts": args.num_long,
        "long_prompts_completed": min(results[m]["interference"]["long_completed"] for m in MODES),
        "long_prompt_tokens": args.long_prompt_tokens,
        "disaggregated_short_p99_ms": _p99s(d[short]),
        "colocated_short_p99_ms": _p99s(c[short]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("port", "output")},
    }


def main(argv: Sequence[str]) -> int:
    """Run both modes; print each mode's numbers, then the comparison as one JSON line."""
    args = parse_args(argv)
    model = load_cluster_config(mode_config(args, MODES[0])).model.name
    resolve_model(model)  # writes the built-in checkpoint once, before any replica races for it
    counter = load_token_counter(None, model)  # the built-in's own tokenizer: exact lengths
    sessions = mixed_sessions(args, counter)
    ray.init(  # a Ray of its own, even if another one runs on this machine
        address="local",
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        results = {mode: run_mode(mode, args, sessions, counter) for mode in MODES}
    finally:
        serve.shutdown()
        ray.shutdown()
    for mode, result in results.items():
        print(f"{mode}: {json.dumps(result, indent=2)}")
    output = headline(results, args)
    if args.output:
        Path(args.output).write_text(json.dumps({**output, **results}, indent=2) + "\n")
    print(json.dumps(output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
