"""The ``slo`` planner: replicas for latency targets, from the profiled capacity model.

Prefill is treated as a queue in front of one server per replica: a prompt of ``L`` uncached
tokens takes ``s = prefill_seconds(L)`` alone, and at utilisation ``rho`` its TTFT is about
``s / (1 - rho)`` (the queueing delay of a busy server grows as ``1 / (1 - rho)``). So the
highest utilisation that meets ``ttft_p90_ms`` is ``1 - s / target`` (kept within 0.1..0.9),
and the pool needs ``arrival tokens/s / (tokens/s per replica * that utilisation)`` replicas —
at least enough to work off the tokens already queued within one target. Decode needs
``concurrency / max_concurrency(itl target, context)`` replicas, never fewer than KV usage asks
for (the ``load`` rule), and one more while sequences wait for a slot. Both read the capacity
model through correction factors: observed p90 over predicted p90, smoothed, so a model
profiled on a quieter day (or a prompt mix it did not see) is corrected by what the ingress
measures. Pure functions; the Serve
policy (``cluster.serve.planner_policy``) feeds them predicted load and keeps the corrections.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.planner.capacity_model import CapacityModel
from cluster.planner.load_policy import PoolDecision, Reason, stepped
from core.config import PlannerConfig

CORRECTION_BOUNDS = (0.5, 4.0)
"""A correction factor never trusts the model by more than 2x nor distrusts it by more than 4x."""
CORRECTION_SMOOTHING = 0.3
"""Weight of the newest observed/predicted ratio in the running correction."""
_RHO_BOUNDS = (0.1, 0.9)


@dataclass(frozen=True)
class PrefillSignals:
    """The prefill pool's load as the ``slo`` planner reads it."""

    num_replicas: int
    prompt_tokens_rate: float = 0.0
    """Uncached prompt tokens arriving per second, whole pool (predicted)."""
    prompt_len: float = 0.0
    """Mean uncached prompt tokens per request (0: not seen yet)."""
    pending_prompt_tokens: float = 0.0


@dataclass(frozen=True)
class DecodeSignals:
    """The decode pool's load as the ``slo`` planner reads it."""

    num_replicas: int
    concurrency: float = 0.0
    """Running plus waiting sequences, whole pool (predicted)."""
    context_len: float = 0.0
    """Mean tokens per running sequence (0: not seen yet)."""
    kv_usage: float = 0.0
    waiting: float = 0.0
    """Sequences queued for a batch slot or KV (part of ``concurrency``)."""


@dataclass(frozen=True)
class Corrections:
    """Observed over predicted p90 latency, per pool (1.0: the model is right)."""

    ttft: float = 1.0
    itl: float = 1.0


def plan_prefill_slo(
    load: PrefillSignals, model: CapacityModel, config: PlannerConfig, k: Corrections
) -> PoolDecision:
    """Prefill replicas that keep TTFT p90 within ``ttft_p90_ms`` at the predicted rate."""
    if load.prompt_tokens_rate <= 0 and load.pending_prompt_tokens <= 0:
        return stepped(load.num_replicas, 0, Reason.IDLE, config)
    length = _prompt_len(load, model)
    target_s = config.ttft_p90_ms / 1000
    per_replica = model.prefill_tokens_per_s(length) / k.ttft
    rho = _clamp(1 - model.prefill_seconds(length) * k.ttft / target_s, *_RHO_BOUNDS)
    need = max(
        1,
        math.ceil(load.prompt_tokens_rate / (per_replica * rho) - 1e-9),
        math.ceil(load.pending_prompt_tokens / (per_replica * target_s) - 1e-9),
    )
    reason = Reason.TTFT_SLO if need != load.num_replicas else Reason.STEADY
    if load.num_replicas == 0:
        reason = Reason.PREFILL_DEMAND
    return stepped(load.num_replicas, need, reason, config)


def plan_decode_slo(
    load: DecodeSignals, model: CapacityModel, config: PlannerConfig, k: Corrections
) -> PoolDecision:
    """Decode replicas that keep ITL p90 within ``itl_p90_ms`` for the predicted concurrency."""
    if load.concurrency <= 0 and load.kv_usage <= 0:
        return stepped(load.num_replicas, 0, Reason.IDLE, config)
    per_replica = model.max_concurrency(config.itl_p90_ms / 1000 / k.itl, _context(load, model))
    by_itl = math.ceil(load.concurrency / per_replica - 1e-9)
    by_kv = math.ceil(max(load.num_replicas, 1) * load.kv_usage / config.decode_kv_usage_target)
    need, reason = (by_itl, Reason.ITL_SLO) if by_itl >= by_kv else (by_kv, Reason.KV_PRESSURE)
    if load.waiting > 0 and need <= load.num_replicas:
        need, reason = load.num_replicas + 1, Reason.DECODE_QUEUE
    need = max(need, 1)
    if need == load.num_replicas:
        reason = Reason.STEADY
    return stepped(load.num_replicas, need, reason, config)


def predicted_ttft_s(load: PrefillSignals, model: CapacityModel) -> float:
    """TTFT the (uncorrected) model expects at this load with the replicas there are now."""
    length = _prompt_len(load, model)
    capacity = max(load.num_replicas, 1) * model.prefill_tokens_per_s(length)
    rho = min(load.prompt_tokens_rate / capacity, _RHO_BOUNDS[1])
    return model.prefill_seconds(length) / (1 - rho)


def predicted_itl_s(load: DecodeSignals, model: CapacityModel) -> float:
    """ITL the (uncorrected) model expects with the sequences spread over today's replicas."""
    per_replica = max(load.concurrency / max(load.num_replicas, 1), 1.0)
    return model.itl_s(per_replica, _context(load, model))


def corrected(previous: float, observed_s: float | None, predicted_s: float) -> float:
    """The running correction after one more observation (unchanged without one)."""
    if observed_s is None or observed_s <= 0 or predicted_s <= 0:
        return previous
    ratio = _clamp(observed_s / predicted_s, *CORRECTION_BOUNDS)
    return _clamp(
        (1 - CORRECTION_SMOOTHING) * previous + CORRECTION_SMOOTHING * ratio, *CORRECTION_BOUNDS
    )


def _prompt_len(load: PrefillSignals, model: CapacityModel) -> float:
    return load.prompt_len or min(p.prompt_len for p in model.prefill)


def _context(load: DecodeSignals, model: CapacityModel) -> float:
    return load.context_len or min(d.context_len for d in model.decode)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)
