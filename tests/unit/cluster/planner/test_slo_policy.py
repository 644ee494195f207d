"""The slo planner on synthetic streams: a ramp is met ahead of time, a long-prompt shift grows
prefill, decode follows concurrency and KV, idleness shrinks both, corrections learn from
observed latency; the capacity model's interpolation and the trend predictor."""

from __future__ import annotations

import pytest

from cluster.planner.capacity_model import CapacityModel, PrefillPoint
from cluster.planner.load_policy import Reason
from cluster.planner.prediction import TrendPredictor
from cluster.planner.slo_policy import (
    CORRECTION_BOUNDS,
    Corrections,
    DecodeSignals,
    PrefillSignals,
    corrected,
    plan_decode_slo,
    plan_prefill_slo,
    predicted_itl_s,
    predicted_ttft_s,
)
from core.config import PlannerConfig
from core.errors import ConfigError
from tests.unit.cluster.planner.synthetic_capacity import MODEL

CONFIG = PlannerConfig(
    mode="slo", profile="x.json", ttft_p90_ms=500, itl_p90_ms=30, decode_kv_usage_target=0.8,
    max_step=4,
)  # fmt: skip
K = Corrections()


def test_the_capacity_model_interpolates_and_extends_pessimistically() -> None:
    assert MODEL.prefill_seconds(550) == pytest.approx(0.55)
    assert MODEL.prefill_seconds(2000) == pytest.approx(2.0)  # proportional past the last point
    assert MODEL.prefill_tokens_per_s(300) == pytest.approx(1000)
    assert MODEL.itl_s(16.5, 100) == pytest.approx(0.0265)
    assert MODEL.itl_s(64, 100) == pytest.approx(0.074)  # along the last slope
    assert MODEL.itl_s(1, 550) == pytest.approx(0.0165)
    assert MODEL.max_concurrency(0.030, 100) == pytest.approx(20.0, abs=0.01)
    assert MODEL.max_concurrency(0.005, 100) == 1.0  # even one sequence is too slow: one
    with pytest.raises(ValueError, match="batch 1"):
        CapacityModel("m", "cpu", (PrefillPoint(100, 4, 0.4),), MODEL.decode)


def test_a_bad_profile_file_names_the_field(tmp_path) -> None:
    path = tmp_path / "p.json"
    MODEL.save(path)
    assert CapacityModel.load(path) == MODEL
    path.write_text('{"model": "m"}')
    with pytest.raises(ConfigError) as err:
        CapacityModel.load(path)
    assert err.value.param == "planner.profile"
    with pytest.raises(ConfigError, match="pdserve profile"):
        CapacityModel.load(tmp_path / "missing.json")


def test_prefill_is_sized_for_the_ttft_target_at_the_arrival_rate() -> None:
    # 100-token prompts take 0.1 s alone: a 0.5 s target allows 80% utilisation -> 800 tok/s each
    steady = plan_prefill_slo(PrefillSignals(1, 3000, 100), MODEL, CONFIG, K)
    assert (steady.target, steady.reason) == (4, Reason.TTFT_SLO)
    assert plan_prefill_slo(PrefillSignals(4, 3000, 100), MODEL, CONFIG, K).reason == Reason.STEADY
    # the same tokens/s in 400-token prompts: 0.4 s alone leaves 20% utilisation -> 200 tok/s
    long_prompts = plan_prefill_slo(PrefillSignals(12, 3000, 400), MODEL, CONFIG, K)
    assert (long_prompts.target, long_prompts.reason) == (15, Reason.TTFT_SLO)
    stepped = plan_prefill_slo(PrefillSignals(4, 3000, 400), MODEL, CONFIG, K)
    assert (stepped.target, stepped.reason) == (8, Reason.STEP_LIMIT)  # 4 at a time
    # a queued backlog must clear within one target even when arrivals stopped
    backlog = plan_prefill_slo(PrefillSignals(1, 0, 100, 2000), MODEL, CONFIG, K)
    assert backlog.target == 4
    idle = plan_prefill_slo(PrefillSignals(3), MODEL, CONFIG, K)
    assert (idle.target, idle.reason) == (0, Reason.IDLE)


def test_a_slower_than_profiled_cluster_gets_more_prefill_replicas() -> None:
    base = plan_prefill_slo(PrefillSignals(2, 1500, 100), MODEL, CONFIG, K).target
    slow = plan_prefill_slo(PrefillSignals(2, 1500, 100), MODEL, CONFIG, Corrections(ttft=2.0))
    assert (base, slow.target) == (2, 5)  # 0.2 s alone: 60% of 500 tok/s each


def test_decode_follows_concurrency_context_and_kv() -> None:
    # 30 ms allows 20 sequences per replica at 100 tokens, fewer at 1000 tokens of context
    assert plan_decode_slo(DecodeSignals(1, 50, 100, 0.2), MODEL, CONFIG, K).target == 3
    long_context = plan_decode_slo(DecodeSignals(8, 50, 1000, 0.2), MODEL, CONFIG, K)
    assert (long_context.target, long_context.reason) == (10, Reason.ITL_SLO)  # 5 each
    kv = plan_decode_slo(DecodeSignals(2, 4, 100, 0.95), MODEL, CONFIG, K)
    assert (kv.target, kv.reason) == (3, Reason.KV_PRESSURE)
    assert plan_decode_slo(DecodeSignals(3), MODEL, CONFIG, K).reason == Reason.IDLE
    slower = plan_decode_slo(DecodeSignals(1, 50, 100, 0.2), MODEL, CONFIG, Corrections(itl=1.5))
    assert slower.target == 5
    queued = plan_decode_slo(DecodeSignals(2, 6, 100, 0.2, waiting=2), MODEL, CONFIG, K)
    assert (queued.target, queued.reason) == (3, Reason.DECODE_QUEUE)


def test_a_replica_never_runs_more_sequences_than_its_engine_allows() -> None:
    capped = CapacityModel("m", "cpu", MODEL.prefill, MODEL.decode, max_num_seqs=8)
    assert capped.max_concurrency(0.030, 100) == 8.0
    decision = plan_decode_slo(DecodeSignals(4, 50, 100, 0.2), capped, CONFIG, K)
    assert decision.target == 7  # 50 sequences, 8 each


def test_corrections_move_toward_observed_over_predicted_and_stay_bounded() -> None:
    load = PrefillSignals(2, 800, 100)
    expected = predicted_ttft_s(load, MODEL)
    assert expected == pytest.approx(0.1 / (1 - 0.4))
    k = 1.0
    for _ in range(30):
        k = corrected(k, 2 * expected, expected)
    assert k == pytest.approx(2.0, rel=1e-3)
    for _ in range(60):
        k = corrected(k, 100 * expected, expected)
    assert k == pytest.approx(CORRECTION_BOUNDS[1])
    assert corrected(1.3, None, expected) == 1.3
    assert predicted_itl_s(DecodeSignals(2, 32, 100), MODEL) == pytest.approx(0.026)


def test_the_predictor_extrapolates_a_rising_trend_only() -> None:
    rising, falling = TrendPredictor(window_s=60), TrendPredictor(window_s=60)
    for t in range(10):
        rising.observe(t, 100.0 * t)
        falling.observe(t, 1000.0 - 100 * t)
    assert rising.predict(5) == pytest.approx(900 + 500)
    assert rising.predict(0) == 900
    assert falling.predict(5) == 100  # sized for what there is now
    short = TrendPredictor(window_s=3)
    for t in range(10):
        short.observe(t, 5.0 if t < 9 else 50.0)
    assert short.predict(1) > 50.0  # old samples fall out of the window
