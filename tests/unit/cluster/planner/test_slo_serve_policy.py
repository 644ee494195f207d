"""The slo planner as Serve's policy object: signals from replica and ingress metrics, ramp
prediction, corrections, the decision log `pdserve status` shows; the deploy schema carries the
capacity model; replicas derive rates from their counters; `pdserve profile` writes a model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cluster.ops.cli import app
from cluster.ops.deploy_schema import app_schema
from cluster.ops.status_view import render_planner
from cluster.planner.capacity_model import CapacityModel
from cluster.planner.decisions import KEEP, PlannerDecision, PlannerLog
from cluster.serve.planner_policy import PdservePlanner
from core.codec import to_plain
from core.config import ClusterConfig
from core.stats import ReplicaStats
from replica.planner_signals import PlannerSignals
from tests.unit.cluster.planner.serve_context import FakeContext, FakeId
from tests.unit.cluster.planner.synthetic_capacity import MODEL


def planner(**overrides: Any) -> PdservePlanner:
    config = {"mode": "slo", "profile": "p.json", "ttft_p90_ms": 500, "itl_p90_ms": 30,
              "max_step": 8, **overrides}  # fmt: skip
    return PdservePlanner(config, to_plain(MODEL))


def contexts(rate: float, seqs: float, ttft: float = 0.0, replicas: int = 1) -> dict:
    ingress = {"ttft_p90_s": {"i": ttft}} if ttft else {}
    return {
        FakeId("Prefill"): FakeContext(
            replicas, replicas, {"prompt_tokens_rate": {"a": rate}, "prompt_len": {"a": 100.0}}
        ),
        FakeId("Decode"): FakeContext(
            1, 1, {"running": {"b": seqs}, "context_len": {"b": 100.0}, "kv_usage": {"b": 0.1}}
        ),
        FakeId("Ingress"): FakeContext(1, 1, ingress),
    }


def by_name(targets: dict) -> dict[str, int]:
    return {key.name: value for key, value in targets.items()}


def test_the_policy_sizes_both_pools_from_replica_and_ingress_metrics() -> None:
    targets, state = planner(prediction_horizon_s=0)(contexts(rate=3000, seqs=50))
    assert by_name(targets) == {"Prefill": 4, "Decode": 3, "Ingress": 1}
    assert {k.name: v["reason"] for k, v in state.items()} == {
        "Prefill": "ttft_slo",
        "Decode": "itl_slo",
    }


def test_a_ramp_is_met_ahead_and_observed_latency_corrects_the_model(monkeypatch) -> None:
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr("cluster.serve.planner_policy._clock", lambda: next(clock))
    ahead, now = planner(prediction_horizon_s=10), planner(prediction_horizon_s=0)
    for rate in (400, 800, 1200, 1600):
        ramp = contexts(rate=rate, seqs=1)
        ahead_targets, now_targets = by_name(ahead(ramp)[0]), by_name(now(ramp)[0])
    assert now_targets["Prefill"] == 2  # 1600 tok/s at 800 per replica
    assert ahead_targets["Prefill"] > now_targets["Prefill"]  # sized for 10 s up the ramp
    slow = planner(prediction_horizon_s=0)
    for _ in range(20):  # clients see 4x the TTFT the model expects
        slow(contexts(rate=800, seqs=1, ttft=2.0))  # model: 0.5 s
    assert slow.corrections.ttft > 2.0
    queued = planner(prediction_horizon_s=0)
    for _ in range(20):  # slow first tokens while decode queues are decode's, not prefill's
        ctx = contexts(rate=800, seqs=1, ttft=2.0)
        next(v for k, v in ctx.items() if k.name == "Decode").aggregated_metrics["waiting"] = {
            "b": 3.0
        }
        queued(ctx)
    assert queued.corrections.ttft == 1.0
    assert by_name(slow(contexts(rate=800, seqs=1))[0])["Prefill"] > 1


def test_decisions_are_logged_once_per_change_for_pdserve_status(monkeypatch) -> None:
    written: list[bytes] = []
    monkeypatch.setattr(
        "ray.experimental.internal_kv._internal_kv_put",
        lambda key, value, overwrite: written.append(value),
    )
    policy = planner(prediction_horizon_s=0)
    for _ in range(3):  # Serve waits out its delay: the same target is no new decision
        policy(contexts(rate=3000, seqs=1))
    log = PlannerLog.from_json(written[-1])
    assert [(d.pool, d.previous, d.target, d.reason) for d in log.decisions] == [
        ("Prefill", 1, 4, "ttft_slo")
    ]
    console = Console(record=True, width=200)
    render_planner(log, console)
    assert "Prefill 1 -> 4 (ttft_slo)" in console.export_text()
    for i in range(KEEP + 5):
        log = log.with_decision(PlannerDecision(float(i), "Decode", 1, 2, "itl_slo"))
    assert len(log.decisions) == KEEP and log.decisions[-1].unix_s == KEEP + 4


def test_a_scale_up_called_off_before_its_replica_started_is_logged(monkeypatch) -> None:
    written: list[bytes] = []
    monkeypatch.setattr(
        "ray.experimental.internal_kv._internal_kv_put",
        lambda key, value, overwrite: written.append(value),
    )
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr("cluster.serve.planner_policy._clock", lambda: next(clock))
    policy = planner(prediction_horizon_s=0)
    burst, idle = contexts(rate=1600, seqs=1), contexts(rate=0, seqs=0)
    for ctx in (*burst.values(), *idle.values()):
        ctx.capacity_adjusted_min_replicas = 1
    policy(burst)  # 1 -> 2
    prefill = next(ctx for key, ctx in idle.items() if key.name == "Prefill")
    prefill.target_num_replicas = 2  # Serve targets 2; the second replica is still starting
    assert by_name(policy(idle)[0])["Prefill"] == 1
    log = PlannerLog.from_json(written[-1])
    assert [(d.pool, d.previous, d.target) for d in log.decisions] == [
        ("Prefill", 1, 2),
        ("Prefill", 2, 1),
    ]


def test_the_slo_planner_needs_a_profile_and_ships_it_in_the_policy_kwargs(tmp_path) -> None:
    pools = {"autoscaling": {"min_replicas": 1, "max_replicas": 4}}
    base = {"model": {"name": "builtin:tiny-moe"}, "prefill": pools, "decode": pools}
    with pytest.raises(ValueError, match=r"needs planner\.profile"):
        ClusterConfig.model_validate({**base, "planner": {"mode": "slo"}})
    path = tmp_path / "p.json"
    MODEL.save(path)
    planner_cfg = {"mode": "slo", "profile": str(path)}
    config = ClusterConfig.model_validate({**base, "planner": planner_cfg})
    kwargs = app_schema(config)["autoscaling_policy"]["policy_kwargs"]
    assert json.loads(json.dumps(kwargs))["capacity"] == to_plain(MODEL)
    assert PdservePlanner(**kwargs).capacity == MODEL
    with pytest.raises(ValueError, match="capacity model"):
        PdservePlanner(kwargs["planner"])


def test_a_replica_reports_arrival_rate_prompt_length_and_context() -> None:
    signals = PlannerSignals()
    first = signals.report(ReplicaStats(prefill_tokens_total=100, requests_total=1), now_s=0.0)
    assert first["prompt_tokens_rate"] == 0.0
    later = ReplicaStats(
        prefill_tokens_total=900, pending_prompt_tokens=200, requests_total=5,
        kv_blocks_total=100, kv_blocks_used=10, kv_block_size=16, num_running=2,
        num_waiting=3, num_waiting_for_kv=2,
    )  # fmt: skip
    report = signals.report(later, now_s=2.0)
    assert report["prompt_tokens_rate"] == pytest.approx(500.0)  # 1000 new tokens in 2 s
    assert report["prompt_len"] == pytest.approx(250.0)  # over 4 new requests
    assert report["context_len"] == pytest.approx(80.0)
    assert report["kv_usage"] == pytest.approx(0.1)
    assert report["waiting"] == 1.0  # imports waiting for their KV are not a queue


def test_pdserve_profile_writes_a_capacity_model_and_its_plots(tmp_path) -> None:
    out = tmp_path / "cap.json"
    config = tmp_path / "tiny.yaml"  # the built-in tiny model: the command, not a model, is tested
    config.write_text('model: {name: "builtin:tiny-llama"}\n')
    result = CliRunner().invoke(
        app, ["profile", str(config), "-o", str(out), "--prompt-lens", "16,64", "--max-len", "64"]
    )
    assert result.exit_code == 0, result.output
    model = CapacityModel.load(out)
    assert {(p.prompt_len, p.batch) for p in model.prefill} == {(16, 1), (16, 4), (64, 1), (64, 4)}
    assert {d.context_len for d in model.decode} == {64}
    assert all(d.itl_s > 0 for d in model.decode) and model.device == "cpu"
    assert (tmp_path / "cap.prefill.png").stat().st_size > 0
    assert (tmp_path / "cap.decode.png").stat().st_size > 0
    bad = CliRunner().invoke(app, ["profile", "local", "--prompt-lens", "a,b"])
    assert bad.exit_code == 2 and "comma-separated" in bad.output


def test_targets_and_logged_decisions_stay_within_each_pools_autoscaling_range(
    monkeypatch,
) -> None:
    written: list[bytes] = []
    monkeypatch.setattr(
        "ray.experimental.internal_kv._internal_kv_put",
        lambda key, value, overwrite: written.append(value),
    )
    burst = contexts(rate=3000, seqs=1)
    idle = contexts(rate=0, seqs=0)
    for ctx in (*burst.values(), *idle.values()):
        ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas = 1, 2
    assert by_name(planner(prediction_horizon_s=0)(idle)[0])["Prefill"] == 1  # asks for 0
    assert not written  # held at the minimum: no decision to log
    assert by_name(planner(prediction_horizon_s=0)(burst)[0])["Prefill"] == 2  # asks for 4
    log = PlannerLog.from_json(written[-1])
    assert [(d.pool, d.previous, d.target) for d in log.decisions] == [("Prefill", 1, 2)]


def test_a_prefill_pool_at_zero_is_sized_for_the_prompts_queued_on_decode() -> None:
    decode = {
        "running": {"b": 4.0},
        "context_len": {"b": 600.0},
        "kv_usage": {"b": 0.2},
        "pending_prompt_tokens": {"b": 200.0},
        "prompt_tokens_rate": {"b": 200.0},
        "prompt_len": {"b": 500.0},
    }
    pools = {FakeId("Prefill"): FakeContext(0, 0), FakeId("Decode"): FakeContext(1, 1, decode)}
    targets, state = planner()(pools)
    prefill = next(k for k in targets if k.name == "Prefill")
    assert 1 <= targets[prefill] < 8 and state[prefill]["reason"] == "prefill_demand"
    decode["prompt_len"] = {"b": 20.0}  # short prompts prefill on decode anyway: no demand
    targets, state = planner()(pools)
    assert (targets[prefill], state[prefill]["reason"]) == (0, "idle")
