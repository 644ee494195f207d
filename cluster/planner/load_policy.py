"""The ``load`` planner: both pools' replica targets from one snapshot of their load.

Pure functions of :class:`PoolLoad` snapshots (no Ray), so decisions are unit-tested on
synthetic metric streams. Prefill is sized by its backlog: the prompt tokens waiting or being
prefilled, over what one replica should carry (``prefill_queue_tokens_per_replica``). Decode is
sized by KV pressure: the replicas that would bring mean KV usage to ``decode_kv_usage_target``,
at least one more while sequences wait for room, and, when ``decode_seqs_per_replica`` is set,
enough replicas for the running plus waiting sequences. A pool with nothing to do asks for its
minimum. One decision moves a pool by at most ``max_step`` replicas; Serve then clamps it to the
pool's autoscaling range and applies its upscale and downscale delays (the cool-downs).

A prefill pool at zero replicas reports nothing, so it is sized by :func:`prefill_demand`: the
decode pool prefills every prompt itself then, and the prompt tokens queued there for prompts
long enough to have gone remote are what a prefill replica would take (``prefill_demand``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from core.config import PlannerConfig


class Reason(enum.StrEnum):
    """Why a pool's target is what it is (a metrics label and a log word)."""

    PREFILL_BACKLOG = "prefill_backlog"
    PREFILL_DEMAND = "prefill_demand"  # a pool at zero: prompts queued on decode want it back
    KV_PRESSURE = "kv_pressure"
    DECODE_QUEUE = "decode_queue"
    DECODE_SEQS = "decode_seqs"
    TTFT_SLO = "ttft_slo"
    ITL_SLO = "itl_slo"
    IDLE = "idle"
    STEADY = "steady"
    STEP_LIMIT = "step_limit"


@dataclass(frozen=True)
class PoolLoad:
    """One pool as the planner sees it: replicas now and their reported load."""

    num_replicas: int
    pending_prompt_tokens: float = 0.0  # summed over replicas
    kv_usage: float = 0.0  # mean over replicas
    running: float = 0.0  # summed
    waiting: float = 0.0  # summed


@dataclass(frozen=True)
class PoolDecision:
    """A pool's new target and the reason for it."""

    target: int
    reason: Reason

    def direction(self, current: int) -> str:
        """``up``, ``down`` or ``hold`` relative to ``current``."""
        return "up" if self.target > current else "down" if self.target < current else "hold"


def plan_prefill(load: PoolLoad, config: PlannerConfig) -> PoolDecision:
    """Enough prefill replicas for the prompt-token backlog."""
    if load.pending_prompt_tokens <= 0 and load.running <= 0 and load.waiting <= 0:
        return stepped(load.num_replicas, 0, Reason.IDLE, config)
    need = math.ceil(load.pending_prompt_tokens / config.prefill_queue_tokens_per_replica)
    need = max(need, 1)
    reason = Reason.PREFILL_BACKLOG if need != load.num_replicas else Reason.STEADY
    if load.num_replicas == 0:
        reason = Reason.PREFILL_DEMAND
    return stepped(load.num_replicas, need, reason, config)


def prefill_demand(decode: PoolLoad, prompt_len: float, threshold_tokens: int) -> PoolLoad:
    """The load of a prefill pool at zero replicas: the decode pool's queued prompt tokens
    while its prompts (mean uncached length ``prompt_len``) are long enough to go remote
    (``disaggregation.local_prefill_threshold_tokens``); none while they would prefill on
    decode anyway."""
    if prompt_len < max(threshold_tokens, 1):
        return PoolLoad(num_replicas=0)
    return PoolLoad(num_replicas=0, pending_prompt_tokens=decode.pending_prompt_tokens)


def plan_decode(load: PoolLoad, config: PlannerConfig) -> PoolDecision:
    """Enough decode replicas for the KV usage target (and the sequence target when set)."""
    current = max(load.num_replicas, 1)
    if load.running <= 0 and load.waiting <= 0 and load.kv_usage <= 0:
        return stepped(load.num_replicas, 0, Reason.IDLE, config)
    need = math.ceil(current * load.kv_usage / config.decode_kv_usage_target - 1e-9)
    reason = Reason.KV_PRESSURE
    if load.waiting > 0 and need <= current:
        need, reason = current + 1, Reason.DECODE_QUEUE
    if config.decode_seqs_per_replica is not None:
        by_seqs = math.ceil((load.running + load.waiting) / config.decode_seqs_per_replica)
        if by_seqs > need:
            need, reason = by_seqs, Reason.DECODE_SEQS
    need = max(need, 1)
    if need == load.num_replicas:
        reason = Reason.STEADY
    return stepped(load.num_replicas, need, reason, config)


def stepped(current: int, need: int, reason: Reason, config: PlannerConfig) -> PoolDecision:
    """``need`` moved at most ``max_step`` from ``current`` (then the reason is the limit)."""
    low, high = current - config.max_step, current + config.max_step
    target = min(max(need, low), high)
    if target != need:
        reason = Reason.STEP_LIMIT
    return PoolDecision(max(target, 0), reason)
