"""Expert parallelism EP=1 against EP=2 on the same total cores, for ``builtin:tiny-moe``.

One run, same weights and requests. EP=1 is one process with all the threads; EP=2 is two
processes (a gloo gang, or NCCL with one GPU per rank) with half the threads each, every rank
serving half the requests (data-parallel attention) and half the experts. Both run the same
expert-parallel layer (at EP=1 its collectives are no-ops); EP=1 also times the plain engine
(no EP layer) as the peer, and a control runs EP=1 on half the threads (one rank's share).
Prints one JSON line: decode tokens/s, per decode step the time in attention (everything
outside the MoE layers) / dispatch / experts / combine, the all-to-all bytes a step puts on
the wire, and the EP=2 / EP=1 throughput ratio.

Usage: ``python benchmarks/expert_parallel.py [--requests 8] [--prompt-tokens 32]
[--new-tokens 64] [--threads 2]``. On a CUDA machine each rank takes its own GPU; with fewer
GPUs than ranks the comparison runs on the CPU.
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

from core.config import EngineConfig, ModelConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.expert_parallel import ExpertPlacement, StepTimer, join_process_group
from engine.gangs import EPStepper, build_ep_stepper
from engine.setup import build_engine_parts, pick_device

MODEL = "builtin:tiny-moe"
NUM_EXPERTS = 8
REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 600.0


def prompts_for(job: dict[str, Any], rank: int, seed: int) -> list[list[int]]:
    """This rank's share of the job's requests (the same prompts whatever the EP size)."""
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(3, 256) for _ in range(job["prompt_tokens"])] for _ in range(job["requests"])
    ]
    return prompts[rank :: job["world_size"]]


def decode_run(engine: LLMEngine, step: Any, prompts: list[list[int]], new_tokens: int) -> float:
    """Queue ``prompts``, run the prefill step, then time the decode steps; wall seconds."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", prompt, params)
    step()  # every prompt fits one step: this is the prefill
    start = time.perf_counter()
    while step():
        pass
    return time.perf_counter() - start


def ep_measure(
    ep: EPStepper[LLMEngine], timer: StepTimer, prompts: list[list[int]], n: int
) -> dict:
    """Warm up, then one measured decode run through the lockstep stepper."""
    engine = ep.engine

    def step() -> bool:
        return ep.step().gang_busy

    decode_run(engine, step, prompts, 4)  # warm-up
    timer.reset()
    decode_start: dict[str, int] = {}

    def measured_step() -> bool:
        busy = step()
        if not decode_start:  # the prefill forward: keep it out of the breakdown
            timer.reset()
            decode_start["bytes"] = ep.ep_model.stats.snapshot()["total_all_to_all_bytes"]
        return busy

    wall_s = decode_run(engine, measured_step, prompts, n)
    steps = max(timer.num_steps, 1)
    stats = ep.ep_model.stats.snapshot()
    total_bytes = stats["total_all_to_all_bytes"] - decode_start["bytes"]
    return {
        "decode_s": wall_s,
        "decode_tokens": len(prompts) * (n - 1),
        "decode_steps": timer.num_steps,
        "step_ms": {k: round(v, 3) for k, v in timer.snapshot()["mean_step_ms"].items()},
        "step_wall_ms": round(1e3 * wall_s / steps, 3),
        "all_to_all_bytes_per_step": total_bytes // steps,
        "load_imbalance": round(stats["load_imbalance"], 3),
    }


def plain_measure(job: dict[str, Any], prompts: list[list[int]]) -> dict:
    """The plain engine (every expert local, no EP layer): the peer of EP=1."""
    parts = build_engine_parts(ModelConfig(name=MODEL), engine_config())
    engine = LLMEngine(parts)

    def step() -> bool:
        busy = engine.has_unfinished()
        engine.step()
        return busy

    decode_run(engine, step, prompts, 4)
    wall_s = decode_run(engine, step, prompts, job["new_tokens"])
    return {"decode_s": wall_s, "decode_tokens": len(prompts) * (job["new_tokens"] - 1)}


def engine_config() -> EngineConfig:
    return EngineConfig(max_model_len=1024, block_size=16, kv_cache_memory_bytes=64 << 20)


def worker(job_path: str, rank: int) -> None:
    """One rank: join the gang, serve its share, write its measurements."""
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(job["threads_per_rank"])
    device = pick_device()
    collective = join_process_group(
        rank, job["world_size"], job["init_method"], device=device, timeout_s=120.0
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    timer = StepTimer(sync)
    placement = ExpertPlacement.contiguous(NUM_EXPERTS, job["world_size"])
    ep = build_ep_stepper(
        ModelConfig(name=MODEL), engine_config(), collective, placement, timer=timer
    )
    prompts = prompts_for(job, rank, seed=0)
    result = {
        "rank": rank,
        "device": device.type,
        "threads": job["threads_per_rank"],
        **ep_measure(ep, timer, prompts, job["new_tokens"]),
    }
    if job["world_size"] == 1:
        result["plain_engine"] = plain_measure(job, prompts)
    Path(job["out_dir"], f"rank{rank}.json").write_text(json.dumps(result))
    collective.close()


def run_gang(
    args: argparse.Namespace, world_size: int, threads_per_rank: int, use_cuda: bool
) -> list[dict]:
    """Launch ``world_size`` worker processes; their results in rank order."""
    with tempfile.TemporaryDirectory(prefix="ep-bench-") as tmp:
        job = {
            "world_size": world_size,
            "threads_per_rank": threads_per_rank,
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "init_method": f"file://{tmp}/rendezvous",
            "out_dir": tmp,
        }
        job_path = Path(tmp, "job.json")
        job_path.write_text(json.dumps(job))
        procs = []
        for rank in range(world_size):
            env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "GLOO_SOCKET_IFNAME": "lo"}
            env["OMP_NUM_THREADS"] = str(job["threads_per_rank"])
            env["CUDA_VISIBLE_DEVICES"] = str(rank) if use_cuda else ""
            cmd = [sys.executable, __file__, "--worker", str(job_path), str(rank)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=REPO_ROOT))
        for proc in procs:
            if proc.wait(timeout=RUN_TIMEOUT_S) != 0:
                raise RuntimeError(f"EP={world_size} worker exited with {proc.returncode}")
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world_size)]


def summarize(ranks: list[dict]) -> dict[str, Any]:
    """Gang-level numbers: tokens over the slowest rank's time, per-step means over ranks."""
    wall_s = max(r["decode_s"] for r in ranks)
    tokens = sum(r["decode_tokens"] for r in ranks)
    phases = ranks[0]["step_ms"].keys()
    return {
        "ranks": len(ranks),
        "threads_per_rank": ranks[0]["threads"],
        "decode_tokens_per_s": round(tokens / wall_s, 1),
        "decode_steps": ranks[0]["decode_steps"],
        "step_wall_ms": round(max(r["step_wall_ms"] for r in ranks), 3),
        "step_ms": {p: round(sum(r["step_ms"][p] for r in ranks) / len(ranks), 3) for p in phases},
        "all_to_all_bytes_per_step": sum(r["all_to_all_bytes_per_step"] for r in ranks),
    }


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the highest throughput (load from other processes only slows runs down)."""
    return max(runs, key=lambda run: run["decode_tokens_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="total threads over all ranks")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs; best is kept")
    parser.add_argument("--worker", nargs=2, metavar=("JOB", "RANK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    half_threads = max(args.threads // 2, 1)
    # name -> (ranks, threads per rank); "ep1_half_threads" is the control: EP=1 on one rank's
    # share of the threads, to tell splitting the cores apart from intra-op threading.
    configs = {
        "ep1": (1, args.threads),
        "ep2": (2, half_threads),
        "ep1_half_threads": (1, half_threads),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    plain: list[float] = []
    for _ in range(args.repeats):
        for name, (world_size, threads) in configs.items():
            ranks = run_gang(args, world_size, threads, use_cuda)
            runs[name].append(summarize(ranks))
            if name == "ep1":
                measured = ranks[0]["plain_engine"]
                plain.append(measured["decode_tokens"] / measured["decode_s"])
    results = {name: best(name_runs) for name, name_runs in runs.items()}
    report = {
        "benchmark": "expert_parallel",
        "model": MODEL,
        "device": "cuda" if use_cuda else "cpu",
        "threads_total": args.threads,
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "plain_engine_decode_tokens_per_s": round(max(plain), 1),
        **results,
        "ep2_over_ep1_decode_tokens_per_s": round(
            results["ep2"]["decode_tokens_per_s"] / results["ep1"]["decode_tokens_per_s"], 3
        ),
        "ep2_over_ep1_all_runs": [
            round(two["decode_tokens_per_s"] / one["decode_tokens_per_s"], 3)
            for one, two in zip(runs["ep1"], runs["ep2"], strict=True)
        ],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
