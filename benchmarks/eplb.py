"""Expert-parallel load balancing on a skewed router: EP=2 before and after one rebalance.

Two processes (a gloo gang on the CPU, or NCCL with one GPU per rank) serve ``builtin:tiny-moe``
with every MoE router biased towards experts 0 and 1 (both owned by rank 0 in the contiguous
placement), so rank 0 computes most routed rows and rank 1 waits for it in every all-to-all.
The gang first serves one workload (each rank its share of the requests: a prefill step, then
decode) and rebalances from its counts. Then it alternates measured runs *before* (switched back
to the contiguous placement) and *after* (the plan), each pair on fresh prompts (prefix caching
is off), and keeps each phase's fastest run: other processes on the machine only slow runs down.
Measured per phase: the load ratio (the busiest rank's computed rows over the mean rank's) and
the mean lockstep step time (the slower rank's).

Prints one JSON line: ``max_mean_load_ratio_before``/``_after``, ``step_time_ratio`` (after /
before, fastest runs), the ratio of every before/after pair, ``busiest_rank_cpu_ratio`` (the
busier rank's CPU time per step, after / before: steadier than wall time on a loaded machine),
the copies placed and how long the switch took.

Usage: ``python benchmarks/eplb.py [--requests 32] [--prompt-tokens 128] [--new-tokens 8]
[--redundant-experts 2] [--logit-bias 8.0] [--runs 5]``. At the default bias nearly every token
picks experts 0 and 1; ``--logit-bias 4`` leaves rank 1 about a tenth of the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from core.config import EngineConfig, EPLBConfig, ModelConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.expert_parallel import ExpertPlacement, join_process_group, max_mean_load_ratio
from engine.expert_parallel.router_skew import skew_routing
from engine.gangs import EPStepper, build_ep_stepper
from engine.setup import pick_device

MODEL = "builtin:tiny-moe"
NUM_EXPERTS = 8
HOT_EXPERTS = (0, 1)
WORLD_SIZE = 2
REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 900.0


def run_workload(ep: EPStepper[LLMEngine], prompts: list[list[int]], new_tokens: int) -> dict:
    """Serve ``prompts`` to the end in lockstep; wall time, steps and rows this rank computed."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        ep.engine.add_request(f"eplb-{time.monotonic_ns()}-{i}", prompt, params)
    computed_before = sum(ep.ep_model.stats.snapshot()["total_tokens_per_expert"])
    steps = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while ep.step().gang_busy:
        steps += 1
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    computed = sum(ep.ep_model.stats.snapshot()["total_tokens_per_expert"]) - computed_before
    return {"wall_s": wall_s, "cpu_s": cpu_s, "steps": steps, "computed_rows": computed}


def rank_prompts(job: dict, rank: int, seed: int) -> list[list[int]]:
    """This rank's half of ``job["requests"]`` random prompts drawn with ``seed``."""
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(3, 256) for _ in range(job["prompt_tokens"])] for _ in range(job["requests"])
    ]
    return prompts[rank::WORLD_SIZE]


def worker(job_path: str, rank: int) -> None:
    """One rank: join the gang, plan from a skewed run, then alternate measured runs before
    and after the switch (same prompts for both of a pair); write the numbers."""
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(job["threads_per_rank"])
    device = pick_device()
    collective = join_process_group(
        rank, WORLD_SIZE, job["init_method"], device=device, timeout_s=120.0
    )
    base = ExpertPlacement.contiguous(NUM_EXPERTS, WORLD_SIZE)
    # NOTE: an interval no run reaches: the benchmark calls rebalance() itself
    eplb = EPLBConfig(redundant_experts=job["redundant_experts"], rebalance_interval_steps=10**9)
    engine_cfg = EngineConfig(
        max_model_len=1024,
        block_size=16,
        kv_cache_memory_bytes=128 << 20,
        enable_prefix_caching=False,  # every run computes its whole prompts
    )
    ep = build_ep_stepper(ModelConfig(name=MODEL), engine_cfg, collective, base, eplb=eplb)
    skew_routing(ep.ep_model.model, HOT_EXPERTS, job["logit_bias"])
    balancer = ep.balancer
    assert balancer is not None
    run_workload(ep, rank_prompts(job, rank, seed=0), job["new_tokens"])  # the planning window
    switch_start = time.perf_counter()
    switched = balancer.rebalance()
    switch_s = time.perf_counter() - switch_start
    plan = balancer.placement
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for seed in range(1, job["runs"] + 1):
        prompts = rank_prompts(job, rank, seed)
        for phase, placement in (("before", base), ("after", plan)):
            balancer.switch_to(placement)
            runs[phase].append(run_workload(ep, prompts, job["new_tokens"]))
    result = {
        "rank": rank,
        "device": device.type,
        "runs": runs,
        "switched": switched,
        "switch_ms": round(1e3 * switch_s, 2),
        "redundant": [list(ids) for ids in plan.redundant],
    }
    Path(job["out_dir"], f"rank{rank}.json").write_text(json.dumps(result))
    collective.close()


def run_gang(args: argparse.Namespace, use_cuda: bool) -> list[dict]:
    """Launch the two ranks; their results in rank order."""
    with tempfile.TemporaryDirectory(prefix="eplb-bench-") as tmp:
        job = {
            "threads_per_rank": max(args.threads // WORLD_SIZE, 1),
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "redundant_experts": args.redundant_experts,
            "logit_bias": args.logit_bias,
            "runs": args.runs,
            "init_method": f"file://{tmp}/rendezvous",
            "out_dir": tmp,
        }
        job_path = Path(tmp, "job.json")
        job_path.write_text(json.dumps(job))
        procs = []
        for rank in range(WORLD_SIZE):
            env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "GLOO_SOCKET_IFNAME": "lo"}
            env["OMP_NUM_THREADS"] = str(job["threads_per_rank"])
            env["CUDA_VISIBLE_DEVICES"] = str(rank) if use_cuda else ""
            cmd = [sys.executable, __file__, "--worker", str(job_path), str(rank)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=REPO_ROOT))
        for proc in procs:
            if proc.wait(timeout=RUN_TIMEOUT_S) != 0:
                raise RuntimeError(f"EPLB worker exited with {proc.returncode}")
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]


def phase_summary(ranks: list[dict], phase: str) -> dict[str, Any]:
    """One phase over the gang: load ratio over ranks (all runs); per run the mean step time
    (the slower rank's wall time: the ranks step together) and the busier rank's CPU time."""
    rows = [sum(run["computed_rows"] for run in r["runs"][phase]) for r in ranks]
    num_runs = len(ranks[0]["runs"][phase])
    steps = max(ranks[0]["runs"][phase][0]["steps"], 1)
    step_ms = [
        round(1e3 * max(r["runs"][phase][i]["wall_s"] for r in ranks) / steps, 3)
        for i in range(num_runs)
    ]
    cpu_ms = [
        round(1e3 * max(r["runs"][phase][i]["cpu_s"] for r in ranks) / steps, 3)
        for i in range(num_runs)
    ]
    return {
        "computed_rows_per_rank": rows,
        "max_mean_load_ratio": round(max_mean_load_ratio([float(n) for n in rows]), 3),
        "steps_per_run": steps,
        "step_ms_per_run": step_ms,
        "step_ms": min(step_ms),
        "busiest_rank_cpu_ms_per_step": min(cpu_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--redundant-experts", type=int, default=2)
    parser.add_argument("--logit-bias", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=2, help="total threads over both ranks")
    parser.add_argument(
        "--runs", type=int, default=5, help="alternating runs per phase; the fastest counts"
    )
    parser.add_argument("--worker", nargs=2, metavar=("JOB", "RANK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= WORLD_SIZE
    ranks = run_gang(args, use_cuda)
    before, after = phase_summary(ranks, "before"), phase_summary(ranks, "after")
    report = {
        "benchmark": "eplb",
        "model": MODEL,
        "device": "cuda" if use_cuda else "cpu",
        "expert_parallel": WORLD_SIZE,
        "threads_total": args.threads,
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "hot_experts": list(HOT_EXPERTS),
        "logit_bias": args.logit_bias,
        "redundant_experts": args.redundant_experts,
        "copies": ranks[0]["redundant"],
        "switch_ms": max(r["switch_ms"] for r in ranks),
        "before": before,
        "after": after,
        "max_mean_load_ratio_before": before["max_mean_load_ratio"],
        "max_mean_load_ratio_after": after["max_mean_load_ratio"],
        "step_time_ratio": round(after["step_ms"] / before["step_ms"], 3),
        "step_time_ratio_pairs": [
            round(a / b, 3)
            for a, b in zip(after["step_ms_per_run"], before["step_ms_per_run"], strict=True)
        ],
        "busiest_rank_cpu_ratio": round(
            after["busiest_rank_cpu_ms_per_step"] / before["busiest_rank_cpu_ms_per_step"], 3
        ),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
