"""The ``slo`` planner against Serve's default request-count autoscaling, plus a chaos line.

One run, one local Ray, the same replica ceiling for both: each pool autoscales between 1 and
``--max-replicas`` replicas with the same delays. The ``default`` mode is Serve's own policy per
pool (``target_ongoing_requests``); the ``planner`` mode installs pdserve's planner (``slo``)
with the capacity model ``pdserve profile`` measures at the start of the run. On two cores the
cores, not the replicas, would bound what the pools serve, so each replica's capacity is bounded
(``max_num_seqs``, ``max_num_batched_tokens``) to make replica count the limit.

The workload ramps: a quiet start, a rising rate of short prompts, a shift to long prompts, a
quiet end (each phase Poisson). Every request is scored against the SLO (TTFT within
``--ttft-ms`` and TPOT within ``--itl-ms``; a failure misses it), and the Serve REST API is
polled every second for the replicas of each pool, integrated into replica-seconds over the
workload and plotted per pool over time (``--plot``).

Chaos line: prefill 1 + decode 2, fixed; a decode replica that is streaming is killed mid-load;
with request migration on, no request may be lost.

Prints one JSON object last with ``slo_attainment_ratio`` and ``replica_seconds_ratio`` (planner
/ default) and ``migration_requests_lost``.
Usage: ``.venv/bin/python benchmarks/planner.py [--plot docs/images/planner_replicas.png]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import ray

from cluster.ops.board_calls import board_snapshot
from cluster.ops.launcher import deploy
from cluster.ops.ray_session import start_local_ray
from cluster.ops.rest import ServeRest
from cluster.planner.profiler import ProfileGrid, profile
from cluster.serve.config_file import load_cluster_config
from core.config import RayClusterConfig
from engine.builtin import resolve_model
from loadtest.config import ArrivalConfig, LoadTestTargetConfig, RandomWorkloadConfig
from loadtest.http_client import OpenAIStreamClient
from loadtest.session_driver import run_sessions
from loadtest.text import TextSynthesizer
from loadtest.tokens import load_token_counter
from loadtest.types import RequestRecord
from loadtest.workloads import build_sessions

MODEL, SERVED, APP = "builtin:tiny-llama", "tiny-llama", "bench-planner"
# (seconds, requests/s, prompt tokens, output tokens)
PHASES = (
    (15, 0.5, 64, 128),  # quiet
    (30, 2.0, 64, 128),  # streams pile up: more ongoing requests than Serve's target of 2
    (30, 4.0, 64, 128),  # heavy decode: still one replica's batch at the ITL target?
    (25, 1.0, 1024, 16),  # the mix shifts to long prompts: prefill-bound
    (15, 0.3, 64, 64),  # quiet
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-replicas", type=int, default=3)
    p.add_argument("--ttft-ms", type=float, default=1000.0)
    p.add_argument("--itl-ms", type=float, default=100.0)
    p.add_argument("--port", type=int, default=8131)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="PNG of replicas per pool over time.")
    return p.parse_args(argv)


def config(args: argparse.Namespace, mode: str, profile_path: Path | None) -> dict[str, Any]:
    scaling = {"min_replicas": 1, "max_replicas": args.max_replicas, "upscale_delay_s": 3.0,
               "downscale_delay_s": 15.0, "target_ongoing_requests": 2.0}  # fmt: skip
    pool: dict[str, Any] = {"num_cpus": 0.5, "autoscaling": scaling}
    if mode == "chaos":
        pool = {"num_cpus": 0.5, "num_replicas": 1}
    planner = {"mode": "off"}
    if mode == "planner":
        planner = {"mode": "slo", "profile": str(profile_path), "ttft_p90_ms": args.ttft_ms,
                   "itl_p90_ms": args.itl_ms, "prediction_horizon_s": 10.0}  # fmt: skip
    return {
        "model": {"name": MODEL, "dtype": "float32", "served_name": SERVED},
        "engine": {
            "max_model_len": 2048,
            "kv_cache_memory_bytes": 32 << 20,
            "max_num_batched_tokens": 128,
            "max_num_seqs": 16,
        },
        "prefill": pool,
        "decode": {**pool, "num_replicas": 2} if mode == "chaos" else pool,
        "transfer": {"bind_host": "127.0.0.1"},
        "disaggregation": {"local_prefill_threshold_tokens": 32},
        "planner": planner,
        "server": {"port": args.port, "num_cpus": 0.25, "max_in_flight_requests": 1024},
        "cluster": {"address": "auto", "app_name": APP},
    }


class ReplicaSampler:
    """Polls Serve's REST details once a second: running replicas per pool over time."""

    def __init__(self, rest: ServeRest) -> None:
        self.rest, self.samples = rest, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            deployments = (self.rest.app_details(APP) or {}).get("deployments", {})
            counts = {
                name: sum(
                    r.get("state") == "RUNNING"
                    for r in deployments.get(name, {}).get("replicas", [])
                )
                for name in ("Prefill", "Decode")
            }
            self.samples.append((time.monotonic() - self.t0, counts["Prefill"], counts["Decode"]))

    def __enter__(self) -> ReplicaSampler:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def replica_seconds(self, until_s: float) -> float:
        """Prefill plus decode replicas integrated over [0, until_s] (1-s samples)."""
        return float(sum(p + d for t, p, d in self.samples if t <= until_s))


async def drive(args: argparse.Namespace, endpoint: str, phases: Sequence[tuple]) -> list:
    """Every phase's Poisson arrivals from its start time; records with absolute start times."""
    counter = load_token_counter(None, MODEL)
    synth = TextSynthesizer(counter)
    target = LoadTestTargetConfig.model_validate(
        {"base_url": endpoint, "model": SERVED, "ignore_eos": True, "temperature": 0.0}
    )
    records: list[RequestRecord] = []
    async with httpx.AsyncClient(timeout=600) as http:
        client = OpenAIStreamClient(http, target, SERVED)

        async def phase(index: int, offset_s: float, spec: tuple) -> None:
            duration, rate, prompt, output = spec
            workload = RandomWorkloadConfig.model_validate(
                {"input_len": {"tokens": prompt}, "output_len": {"tokens": output}}
            )
            count = max(1, round(duration * rate))
            sessions = build_sessions(workload, synth, args.seed + index)
            batch = [next(sessions) for _ in range(count)]
            arrivals = ArrivalConfig.model_validate(
                {"request_rate": rate, "num_requests": count, "seed": args.seed + index}
            )
            await asyncio.sleep(offset_s)
            result = await run_sessions(batch, arrivals, client, counter)
            records.extend((offset_s, r) for r in result.records)  # type: ignore[arg-type]

        offsets = [sum(p[0] for p in phases[:i]) for i in range(len(phases))]
        await asyncio.gather(
            *(phase(i, o, s) for i, (o, s) in enumerate(zip(offsets, phases, strict=True)))
        )
    return records


def attainment(records: list, args: argparse.Namespace) -> float:
    met = [r.success and r.ttft_s * 1000 <= args.ttft_ms and r.tpot_s * 1000 <= args.itl_ms
           for _, r in records]  # fmt: skip
    return sum(met) / len(met) if met else 0.0


def run_mode(args: argparse.Namespace, mode: str, dashboard: str, profile_path: Path) -> dict:
    rest = ServeRest(dashboard)
    endpoint = deploy(load_cluster_config(config(args, mode, profile_path)), dashboard)
    try:
        with ReplicaSampler(rest) as sampler:
            records = asyncio.run(drive(args, endpoint, PHASES))
        end_s = max(offset + r.start_s + r.latency_s for offset, r in records)
        return {
            "requests": len(records),
            "failed": sum(not r.success for _, r in records),
            "slo_attainment": attainment(records, args),
            "replica_seconds": sampler.replica_seconds(end_s),
            "duration_s": end_s,
            "timeline": sampler.samples,
        }
    finally:
        remove(rest)


def remove(rest: ServeRest) -> None:
    """Delete the app and wait until Serve has stopped its replicas."""
    rest.remove(APP)
    deadline = time.monotonic() + 180
    while rest.app_details(APP) is not None and time.monotonic() < deadline:
        time.sleep(1.0)


def migrations(endpoint: str) -> float:
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("pdserve:request_migrations_total"))  # fmt: skip


def chaos(args: argparse.Namespace, dashboard: str) -> dict[str, Any]:
    """Decode killed mid-load (migration on): how many requests were lost."""
    rest = ServeRest(dashboard)
    endpoint = deploy(load_cluster_config(config(args, "chaos", None)), dashboard)
    try:
        before = migrations(endpoint)

        def killer() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                busy = [d for d in board_snapshot(APP).get("decode", [])
                        if d["stats"]["num_running"] > 0]  # fmt: skip
                if busy:
                    ray.kill(
                        ray.get_actor(busy[0]["actor_name"], namespace="serve"), no_restart=True
                    )
                    return
                time.sleep(0.2)

        timer = threading.Timer(5.0, killer)
        timer.start()
        records = asyncio.run(drive(args, endpoint, ((20, 1.5, 64, 64),)))
        timer.join()
        return {"requests": len(records), "lost": sum(not r.success for _, r in records),
                "migrations": migrations(endpoint) - before}  # fmt: skip
    finally:
        remove(rest)


def plot(results: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for ax, column, pool in ((axes[0], 1, "prefill"), (axes[1], 2, "decode")):
        for mode, style in (("default", "--"), ("planner", "-")):
            samples = results[mode]["timeline"]
            ax.step([s[0] for s in samples], [s[column] for s in samples], style, where="post",
                    label=f"{mode}")  # fmt: skip
        ax.set_ylabel(f"{pool} replicas")
        ax.legend(loc="upper left")
    start = 0.0
    for duration, rate, prompt, _ in PHASES:
        axes[0].annotate(f"{rate}/s x{prompt}", (start + 1, 0.2), fontsize=7)
        for ax in axes:
            ax.axvline(start, color="grey", lw=0.5)
        start += duration
    axes[1].set_xlabel("time (s)")
    fig.suptitle("Replicas per pool: slo planner vs Serve's default autoscaler")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    resolve_model(MODEL)
    with tempfile.TemporaryDirectory(prefix="pdserve-planner-") as workdir:  # removed after
        return run(args, Path(workdir))


def run(args: argparse.Namespace, workdir: Path) -> int:
    profile_path = workdir / "profile.json"
    bench = load_cluster_config(config(args, "default", None))
    grid = ProfileGrid(prompt_lens=(64, 256, 1024), context_lens=(128, 1024),
                       concurrencies=(1, 4, 8, 16))  # fmt: skip
    capacity = profile(bench, grid)
    capacity.save(profile_path)
    session = start_local_ray(RayClusterConfig(address="local", num_cpus=8))
    try:
        results = {mode: run_mode(args, mode, session.dashboard_url, profile_path)
                   for mode in ("default", "planner")}  # fmt: skip
        lost = chaos(args, session.dashboard_url)
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    if args.plot:
        plot(results, args.plot)
    d, p = results["default"], results["planner"]
    for mode, r in results.items():
        print(f"{mode:8s} attainment {r['slo_attainment']:.3f}  replica-s "
              f"{r['replica_seconds']:.0f}  failed {r['failed']}/{r['requests']}")  # fmt: skip
    print(f"chaos: {lost}")
    output = {
        "benchmark": "planner",
        "settings": {k: v for k, v in vars(args).items() if k not in ("port", "plot")},
        "phases": PHASES,
        "default": {k: v for k, v in d.items() if k != "timeline"},
        "planner": {k: v for k, v in p.items() if k != "timeline"},
        "chaos": lost,
        "slo_attainment_ratio": p["slo_attainment"] / d["slo_attainment"]
        if d["slo_attainment"]
        else None,
        "replica_seconds_ratio": p["replica_seconds"] / d["replica_seconds"],
        "migration_requests_lost": lost["lost"],
    }
    print(json.dumps(output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
