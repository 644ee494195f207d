"""A real two-process gloo gang: greedy outputs equal the single-rank engine and HF, requests
land unevenly (one rank idle), and a rank that dies or stalls makes its peer fail fast.

No assertion reads a clock: that a dead peer is noticed without waiting for a timeout follows
from the gang's process-group timeout lying beyond the test's own; that a broken gang refuses at
once, from the error saying so before any collective runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.builtin import resolve_model
from engine.expert_parallel import rendezvous_address
from tests.unit.engine.models.hf_checkpoints import add_byte_tokenizer, hf_greedy, save_checkpoint

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[4]
GANG_TIMEOUT_S = 120.0  # bound on a whole gang run (they take seconds)
PEER_TIMEOUT_S = 600.0
"""The dying gang's process-group timeout: past ``GANG_TIMEOUT_S`` (and the test's own), so its
peer can only notice the death from the closed connection."""
STALL_PG_TIMEOUT_S = 3.0

# name -> (model, prompts of rank 0, prompts of rank 1, max_tokens)
SCENARIOS: dict[str, tuple[str, list[list[int]], list[list[int]], int]] = {
    "tiny-moe-rank1-idle": ("builtin:tiny-moe", [[5, 80, 81, 82], [300, 12], [44] * 9], [], 8),
    "mixtral-rank0-idle": ("mixtral", [], [[3, 17, 42, 99, 5], [77]], 10),
    "qwen2-moe-both-busy": ("qwen2-moe", [[200, 1, 7, 7, 7, 150, 61]], [[9, 8], [250, 19, 4]], 10),
}

WORKER_MODULE = "tests.unit.engine.expert_parallel.ep_worker"


def start_gang(tmp_path: Path, job: dict[str, Any]) -> list[subprocess.Popen[bytes]]:
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps({**job, "out_dir": str(tmp_path), "world_size": 2}))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    return [
        subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, str(job_path), str(r)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=(tmp_path / f"rank{r}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]


def finish_gang(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
    """Wait for rank 0, then release rank 1 (stdin) and wait for it; bounded, kill on timeout."""
    try:
        procs[0].wait(timeout=GANG_TIMEOUT_S)
        assert procs[1].stdin is not None
        procs[1].stdin.close()
        procs[1].wait(timeout=GANG_TIMEOUT_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    logs = "\n".join((tmp_path / f"rank{r}.log").read_text()[-3000:] for r in range(2))
    assert procs[0].returncode == 0, logs
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = {"builtin:tiny-moe": str(resolve_model("builtin:tiny-moe"))}
    for preset in ("mixtral", "qwen2-moe"):
        ckpt = save_checkpoint(preset, tmp_path_factory.mktemp(f"ep-{preset}"))
        add_byte_tokenizer(ckpt.path)
        paths[preset] = str(ckpt.path)
    return paths


@pytest.fixture(scope="module")
def gang_run(
    tmp_path_factory: pytest.TempPathFactory, model_paths: dict[str, str]
) -> list[dict[str, Any]]:
    """One gang run: every scenario, then rank 1 dies mid-generation."""
    tmp_path = tmp_path_factory.mktemp("ep-gang")
    scenarios = [
        {
            "name": name,
            "model": model_paths[model],
            "prompts": [prompts0, prompts1],
            "max_tokens": max_tokens,
        }
        for name, (model, prompts0, prompts1, max_tokens) in SCENARIOS.items()
    ]
    job = {
        "init_method": f"file://{tmp_path / 'rendezvous'}",
        "timeout_s": PEER_TIMEOUT_S,
        "scenarios": scenarios,
        "ending": "die",
    }
    return finish_gang(tmp_path, start_gang(tmp_path, job))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_gang_greedy_output_matches_single_rank_engine_and_hf(
    name: str, gang_run: list[dict[str, Any]], model_paths: dict[str, str]
) -> None:
    model, prompts0, prompts1, max_tokens = SCENARIOS[name]
    got = {**gang_run[0]["scenarios"][name]["tokens"], **gang_run[1]["scenarios"][name]["tokens"]}
    request_ids = [f"{name}-0-{i}" for i in range(len(prompts0))]
    request_ids += [f"{name}-1-{i}" for i in range(len(prompts1))]
    prompts = prompts0 + prompts1
    assert sorted(got) == sorted(request_ids)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    single = LLM(model_paths[model], max_model_len=256, block_size=8)
    outs = single.generate(prompt_token_ids=prompts, sampling_params=params)
    hf_model = AutoModelForCausalLM.from_pretrained(model_paths[model]).eval()
    for rid, prompt, out in zip(request_ids, prompts, outs, strict=True):
        hf_tokens, _ = hf_greedy(hf_model, prompt, max_tokens)
        assert got[rid] == list(out.token_ids) == hf_tokens, rid


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_gang_steps_together_and_idle_rank_serves_its_experts(
    name: str, gang_run: list[dict[str, Any]]
) -> None:
    runs = [gang_run[rank]["scenarios"][name] for rank in range(2)]
    assert runs[0]["steps"] == runs[1]["steps"] > 0
    for rank, run in enumerate(runs):
        has_requests = bool(SCENARIOS[name][1 + rank])
        if not has_requests:
            assert run["empty_steps"] == run["steps"]
        # Each rank holds half the experts in every MoE layer, never the others' weights.
        num_experts = len(run["stats"]["total_tokens_per_expert"])
        assert set(run["held_experts"]) == {num_experts // 2}
        held = set(run["stats"]["expert_ids"])
        computed = run["stats"]["total_tokens_per_expert"]
        assert all(n == 0 for e, n in enumerate(computed) if e not in held)
        assert sum(computed) > 0  # even the idle rank computes rows for its peer's tokens
    stats = [run["stats"] for run in runs]
    routed = [
        a + b for a, b in zip(*(s["total_routed_tokens_per_expert"] for s in stats), strict=True)
    ]
    computed = [a + b for a, b in zip(*(s["total_tokens_per_expert"] for s in stats), strict=True)]
    assert routed == computed
    assert sum(r["stats"]["total_all_to_all_bytes"] for r in runs) > 0


def test_a_rank_that_dies_makes_its_peer_fail_fast_with_a_typed_error(
    gang_run: list[dict[str, Any]],
) -> None:
    first, second = gang_run[0]["ending"]["errors"]
    assert first["type"] == "UnavailableError"
    assert first["status"] == 503
    assert "peer rank died or stalled" in first["message"]  # before PEER_TIMEOUT_S: no timeout
    assert second["type"] == "UnavailableError"
    assert "must be restarted" in second["message"]  # refused before any collective ran


def test_a_rank_that_stalls_makes_its_peer_time_out_with_a_typed_error(tmp_path: Path) -> None:
    job = {
        "init_method": rendezvous_address("127.0.0.1"),
        "timeout_s": STALL_PG_TIMEOUT_S,
        "scenarios": [],
        "ending": "stall",
    }
    rank0, _ = finish_gang(tmp_path, start_gang(tmp_path, job))
    first, second = rank0["ending"]["errors"]
    assert first["type"] == "UnavailableError"
    assert "timed out" in first["message"].lower()  # the process group's own timeout
    assert second["type"] == "UnavailableError"
    assert "must be restarted" in second["message"]
