"""``benchmarks/gpu_pd.py`` on a CPU: its arithmetic on known runs, and one small end-to-end run
(two worker processes, both paths, pipelined and not) whose JSON line carries every key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_pd import MODES, Run, overlap, summarize

ROOT = Path(__file__).resolve().parents[3]
HEADLINE = (
    "device",
    "grpc_pull_gbps",
    "same_node_pull_gbps",
    "second_token_8k_same_node_ratio",
    "second_token_8k_grpc_ratio",
    "overlap_fraction",
)


def run(mode: str, second_s: float, **kw: Any) -> Run:
    return Run(1024, mode, second_s, (1, 2, 3), **kw)


def test_overlap_is_the_share_of_the_pull_hidden_behind_prefill() -> None:
    hidden = run("grpc_pipelined", 1.0, prefill_done_s=0.8, kv_ready_s=0.82)
    assert overlap(hidden, pull_s=0.1) == pytest.approx(0.8)  # 20 ms of 100 exposed
    exposed = run("grpc_pipelined", 1.0, prefill_done_s=0.8, kv_ready_s=0.95)
    assert overlap(exposed, pull_s=0.1) == 0.0  # worse than the sequential pull: none hidden
    early = run("grpc_pipelined", 1.0, prefill_done_s=0.8, kv_ready_s=0.79)
    assert overlap(early, pull_s=0.1) == 1.0


def test_summary_takes_medians_at_the_reference_length() -> None:
    runs = [
        run("colocated", 0.100),
        run("colocated", 0.120),
        run("colocated", 0.110),
        run("grpc", 0.160, prefill_done_s=0.1, kv_ready_s=0.15, pull_bytes=10**9, pull_s=0.05),
        run("grpc_pipelined", 0.132, prefill_done_s=0.1, kv_ready_s=0.11),
        run("same_node", 0.130, prefill_done_s=0.1, kv_ready_s=0.12, pull_bytes=10**9, pull_s=0.01),
        run("same_node_pipelined", 0.121, prefill_done_s=0.1, kv_ready_s=0.101),
        Run(64, "colocated", 9.0, (1,)),  # another length: not in the headline
    ]
    got = summarize(runs, ref_tokens=1024)
    assert got["grpc_pull_gbps"] == 20.0 and got["same_node_pull_gbps"] == 100.0
    assert got["second_token_8k_grpc_ratio"] == 1.2  # 132 over the median colocated 110
    assert got["second_token_8k_same_node_ratio"] == 1.1
    assert got["second_token_8k_grpc_sequential_ratio"] == pytest.approx(1.455, abs=1e-3)
    assert got["overlap_fraction"] == pytest.approx(0.8)  # 10 ms of a 50 ms pull exposed
    assert got["overlap_fraction_same_node"] == pytest.approx(0.9)
    assert got["targets_met"] == {
        "grpc_pull_gbps": True,
        "same_node_pull_gbps": True,
        "second_token_8k_grpc_ratio": True,
        "second_token_8k_same_node_ratio": True,
        "overlap_fraction": True,
    }
    assert {(r["prompt_tokens"], r["mode"]) for r in got["rows"]} == {
        *((1024, m) for m in MODES),
        (64, "colocated"),
    }


@pytest.mark.timeout(300)
def test_a_small_run_on_cpu_prints_every_key() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_pd.py"),
            *("--lens", "48,160", "--ref-tokens", "160", "--chunk-tokens", "32"),
            *("--repeats", "1"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # the worker processes import this tree
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(key in result for key in HEADLINE), result
    assert result["device"] == "cpu" and result["ref_prompt_tokens"] == 160
    assert result["grpc_pull_gbps"] > 0 and result["same_node_pull_gbps"] > 0
    assert 0.0 <= result["overlap_fraction"] <= 1.0
    modes = {(row["prompt_tokens"], row["mode"]) for row in result["rows"]}
    assert modes == {(n, m) for n in (48, 160) for m in MODES}
    # 160 tokens are 10 blocks: every P/D mode moved them all
    moved = {
        row["pull_mib"]
        for row in result["rows"]
        if row["prompt_tokens"] == 160 and row["mode"] != "colocated"
    }
    assert len(moved) == 1 and moved.pop() > 0
