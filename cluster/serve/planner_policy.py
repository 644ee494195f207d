"""pdserve's planner as Ray Serve's application-level autoscaling policy.

Serve (2.60) calls :class:`PdservePlanner` on its controller every autoscaling tick with an
``AutoscalingContext`` per autoscaled deployment of the app; each pool's replicas report the
planner's inputs through ``record_autoscaling_stats`` (``replica.planner_signals``) and, in
``slo`` mode, the ingress reports the p90 latencies clients saw. Serve averages them over the
look-back window into ``ctx.aggregated_metrics[name][replica]``. The planner turns both pools'
load into targets in one decision — ``load`` mode by thresholds (``cluster.planner.load_policy``),
``slo`` mode from the capacity model, predicted load and learned corrections
(``cluster.planner.slo_policy``), then clamps each to the pool's ``autoscaling`` range (what
Serve would apply anyway, so the log never shows a size the pool cannot take); Serve applies its
delays. Every change is logged with its reason, counted as the Ray metric
``pdserve_planner_decisions`` (pool, direction, reason) and written for ``pdserve status``
(``cluster.planner.decisions``).

An in-place upgrade of the planner's thresholds or of ``disaggregation`` reaches the policy
through the GCS (``cluster.serve.planner_settings``: the ingress publishes, the policy reads
once a second), since Serve builds the policy once from ``policy_kwargs``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from cluster.planner.capacity_model import CapacityModel
from cluster.planner.decisions import PlannerDecision, PlannerLog, decisions_key
from cluster.planner.load_policy import (
    PoolDecision,
    PoolLoad,
    plan_decode,
    plan_prefill,
    prefill_demand,
)
from cluster.planner.prediction import TrendPredictor
from cluster.planner.slo_policy import (
    Corrections,
    DecodeSignals,
    PrefillSignals,
    corrected,
    plan_decode_slo,
    plan_prefill_slo,
    predicted_itl_s,
    predicted_ttft_s,
)
from cluster.serve import planner_settings
from cluster.serve.planner_settings import PlannerSettings
from cluster.serve.pool_options import DECODE_DEPLOYMENT, INGRESS_DEPLOYMENT, PREFILL_DEPLOYMENT
from core.codec import from_plain
from core.config import DisaggregationConfig, PlannerConfig

logger = logging.getLogger(__name__)


def _clock() -> float:
    """The planner's clock (``time.monotonic``; tests replace this function, not the module's
    ``time``, which every thread of the process shares)."""
    return time.monotonic()


SettingsReader = Callable[[str, PlannerSettings], PlannerSettings | None]
"""``(app name, deployed settings) -> published settings`` (``planner_settings.read``)."""

POLICY_FUNCTION = "cluster.serve.planner_policy:PdservePlanner"
"""The import path Serve loads the policy class from."""
SAMPLE_PERIOD_S = 1.0
"""How often the slo planner samples load for prediction and updates its corrections."""


class PoolMetrics:
    """One deployment's reported metrics, summed or averaged over its replicas."""

    def __init__(self, ctx: Any) -> None:
        self.num_replicas = int(ctx.current_num_replicas)
        self.min_replicas = int(getattr(ctx, "capacity_adjusted_min_replicas", 0))
        self.max_replicas = int(getattr(ctx, "capacity_adjusted_max_replicas", 1 << 30))
        self._metrics: Mapping[str, Mapping[Any, float]] = ctx.aggregated_metrics or {}
        self._last_scale_down_s = getattr(ctx, "last_scale_down_time", None)
        self._now_s = getattr(ctx, "current_time", None)
        self._look_back_s = getattr(getattr(ctx, "config", None), "look_back_period_s", None)

    def scaled_down_within_look_back(self) -> bool:
        """True while the metrics window still covers the time before the last scale-down
        (what other pools report then describes the pool as it was)."""
        down_s, now_s, window_s = self._last_scale_down_s, self._now_s, self._look_back_s
        if down_s is None or now_s is None or window_s is None:
            return False
        return bool(now_s - down_s < window_s)

    def total(self, name: str) -> float:
        return float(sum(self._metrics.get(name, {}).values()))

    def mean(self, name: str, skip_zero: bool = False) -> float:
        values = [v for v in self._metrics.get(name, {}).values() if v or not skip_zero]
        return sum(values) / len(values) if values else 0.0

    def bounded(self, decision: PoolDecision) -> PoolDecision:
        """``decision`` within the pool's autoscaling range."""
        target = min(max(decision.target, self.min_replicas), self.max_replicas)
        return decision if target == decision.target else replace(decision, target=target)

    def load(self) -> PoolLoad:
        return PoolLoad(
            num_replicas=self.num_replicas,
            pending_prompt_tokens=self.total("pending_prompt_tokens"),
            kv_usage=self.mean("kv_usage"),
            running=self.total("running"),
            waiting=self.total("waiting"),
        )


def pool_load(ctx: Any) -> PoolLoad:
    """A pool's :class:`PoolLoad` from its Serve ``AutoscalingContext``."""
    return PoolMetrics(ctx).load()


class PdservePlanner:
    """The policy object Serve instantiates once with ``policy_kwargs``: the planner config
    and, for ``slo``, the capacity model (plain data, read from the profile at deploy time)."""

    def __init__(
        self,
        planner: Mapping[str, Any],
        capacity: Any = None,
        disaggregation: Mapping[str, Any] | None = None,
        read_settings: SettingsReader = planner_settings.read,
    ) -> None:
        self.config = PlannerConfig.model_validate(dict(planner))
        self.disaggregation = DisaggregationConfig.model_validate(dict(disaggregation or {}))
        self._deployed = PlannerSettings(self.config, self.disaggregation)
        self._read_settings = read_settings
        self._settings_read_s: float | None = None
        self.capacity = from_plain(CapacityModel, capacity) if capacity is not None else None
        if self.config.mode == "slo" and self.capacity is None:
            raise ValueError("the slo planner needs its capacity model")
        self.corrections = Corrections()
        self._rate = TrendPredictor()
        self._concurrency = TrendPredictor()
        self._last_sample_s = 0.0
        self._log = PlannerLog(self.config.mode)
        self._last_target: dict[str, int] = {}
        self._counter: Any = None

    def __call__(self, contexts: Mapping[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        """Both pools' targets and their policy state; other deployments keep theirs."""
        if contexts:
            self._follow_settings(next(iter(contexts)).app_name, _clock())
        pools = {d.name: (d, PoolMetrics(ctx)) for d, ctx in contexts.items()}
        targets = {d: int(ctx.target_num_replicas) for d, ctx in contexts.items()}
        previous = dict(targets)
        decisions = (
            self._plan_slo(pools, _clock()) if self.config.mode == "slo" else self._plan_load(pools)
        )
        state: dict[Any, dict] = {}
        for name, (decision, detail) in decisions.items():
            deployment_id, metrics = pools[name]
            decision = metrics.bounded(decision)
            targets[deployment_id] = decision.target
            state[deployment_id] = {"target": decision.target, "reason": decision.reason.value}
            # NOTE: logged against Serve's target, not the running count: a scale-up called off
            # before its replica started is a decision too (running 1, target 2 -> 1)
            self._record(deployment_id.app_name, name, previous[deployment_id], decision, detail)
        return targets, state

    def _follow_settings(self, app_name: str, now_s: float) -> None:
        """Take the settings an in-place upgrade published (at most once per
        ``planner_settings.READ_PERIOD_S``; none published: the deployed ones). A failed read
        keeps the settings in use."""
        last = self._settings_read_s
        if last is not None and now_s - last < planner_settings.READ_PERIOD_S:
            return
        self._settings_read_s = now_s
        try:
            settings = self._read_settings(app_name, self._deployed) or self._deployed
        except Exception as e:  # the GCS is briefly unreachable: decide by what we have
            logger.warning("planner settings not read: %s", e)
            return
        if settings == PlannerSettings(self.config, self.disaggregation):
            return
        self.config, self.disaggregation = settings.planner, settings.disaggregation
        logger.info("planner: settings changed in place: %s", settings.to_json())

    def _plan_load(
        self, pools: Mapping[str, tuple[Any, PoolMetrics]]
    ) -> dict[str, tuple[PoolDecision, str]]:
        out = {}
        for name, plan in ((PREFILL_DEPLOYMENT, plan_prefill), (DECODE_DEPLOYMENT, plan_decode)):
            if name in pools:
                load = pools[name][1].load()
                if name == PREFILL_DEPLOYMENT and load.num_replicas == 0:
                    load = self._demand_at_zero(pools) or load
                out[name] = (plan(load, self.config), str(load))
        return out

    def _demand_at_zero(self, pools: Mapping[str, tuple[Any, PoolMetrics]]) -> PoolLoad | None:
        """What a prefill pool at zero replicas would take, read off the decode pool; none
        while decode's window still covers the time before prefill went to zero (its queue
        then was the prefill pool's work, not new demand: it would bounce right back)."""
        if DECODE_DEPLOYMENT not in pools:
            return None
        if pools[PREFILL_DEPLOYMENT][1].scaled_down_within_look_back():
            return None
        decode = pools[DECODE_DEPLOYMENT][1]
        prompt_len = decode.mean("prompt_len", skip_zero=True)
        threshold = self.disaggregation.local_prefill_threshold_tokens
        return prefill_demand(decode.load(), prompt_len, threshold)

    def _plan_slo(
        self, pools: Mapping[str, tuple[Any, PoolMetrics]], now_s: float
    ) -> dict[str, tuple[PoolDecision, str]]:
        assert self.capacity is not None
        prefill, decode = self._signals(pools)
        ingress = pools.get(INGRESS_DEPLOYMENT)
        if now_s - self._last_sample_s >= SAMPLE_PERIOD_S:
            self._last_sample_s = now_s
            self._sample(prefill, decode, ingress[1] if ingress else None, now_s)
        horizon = self.config.prediction_horizon_s
        k, out = self.corrections, {}
        if prefill is not None and prefill.num_replicas == 0:
            demand = self._demand_at_zero(pools)
            if demand is not None and demand.pending_prompt_tokens > 0:
                decode_metrics = pools[DECODE_DEPLOYMENT][1]
                prefill = PrefillSignals(
                    0,
                    decode_metrics.total("prompt_tokens_rate"),
                    decode_metrics.mean("prompt_len", skip_zero=True),
                    demand.pending_prompt_tokens,
                )
        if prefill is not None:
            ahead = PrefillSignals(
                prefill.num_replicas, max(prefill.prompt_tokens_rate, self._rate.predict(horizon)),
                prefill.prompt_len, prefill.pending_prompt_tokens,
            )  # fmt: skip
            out[PREFILL_DEPLOYMENT] = (plan_prefill_slo(ahead, self.capacity, self.config, k),
                                       f"{ahead} ttft x{k.ttft:.2f}")  # fmt: skip
        if decode is not None:
            ahead_d = DecodeSignals(
                decode.num_replicas, max(decode.concurrency, self._concurrency.predict(horizon)),
                decode.context_len, decode.kv_usage, decode.waiting,
            )  # fmt: skip
            out[DECODE_DEPLOYMENT] = (plan_decode_slo(ahead_d, self.capacity, self.config, k),
                                      f"{ahead_d} itl x{k.itl:.2f}")  # fmt: skip
        return out

    @staticmethod
    def _signals(
        pools: Mapping[str, tuple[Any, PoolMetrics]],
    ) -> tuple[PrefillSignals | None, DecodeSignals | None]:
        prefill = decode = None
        if PREFILL_DEPLOYMENT in pools:
            m = pools[PREFILL_DEPLOYMENT][1]
            prefill = PrefillSignals(
                m.num_replicas, m.total("prompt_tokens_rate"),
                m.mean("prompt_len", skip_zero=True), m.total("pending_prompt_tokens"),
            )  # fmt: skip
        if DECODE_DEPLOYMENT in pools:
            m = pools[DECODE_DEPLOYMENT][1]
            decode = DecodeSignals(
                m.num_replicas, m.total("running") + m.total("waiting"),
                m.mean("context_len", skip_zero=True), m.mean("kv_usage"), m.total("waiting"),
            )  # fmt: skip
        return prefill, decode

    def _sample(
        self,
        prefill: PrefillSignals | None,
        decode: DecodeSignals | None,
        ingress: PoolMetrics | None,
        now_s: float,
    ) -> None:
        """Feed the predictors and move the corrections toward observed / predicted."""
        assert self.capacity is not None
        ttft = ingress.mean("ttft_p90_s", skip_zero=True) if ingress else 0.0
        itl = ingress.mean("itl_p90_s", skip_zero=True) if ingress else 0.0
        k = self.corrections
        if prefill is not None:
            self._rate.observe(now_s, prefill.prompt_tokens_rate)
            # NOTE: TTFT beyond the model is prefill's only while decode is not queueing
            decode_queued = decode is not None and decode.waiting > 0
            if prefill.prompt_tokens_rate > 0 and ttft > 0 and not decode_queued:
                expected = predicted_ttft_s(prefill, self.capacity)
                k = Corrections(corrected(k.ttft, ttft, expected), k.itl)
        if decode is not None:
            self._concurrency.observe(now_s, decode.concurrency)
            if decode.concurrency > 0 and itl > 0:
                expected = predicted_itl_s(decode, self.capacity)
                k = Corrections(k.ttft, corrected(k.itl, itl, expected))
        self.corrections = k

    def _record(
        self, app_name: str, pool: str, current: int, decision: PoolDecision, detail: str
    ) -> None:
        direction = decision.direction(current)
        if direction == "hold" or self._last_target.get(pool) == decision.target:
            return  # NOTE: the same target again while Serve waits out a delay is no new decision
        self._last_target[pool] = decision.target
        reason = decision.reason.value
        logger.info(
            "planner: %s %s %d -> %d (%s; %s)", pool, direction, current, decision.target, reason,
            detail,
        )  # fmt: skip
        entry = PlannerDecision(time.time(), pool, current, decision.target, reason, detail)
        self._log = self._log.with_decision(entry)
        try:
            from ray.experimental.internal_kv import _internal_kv_put
            from ray.util.metrics import Counter

            _internal_kv_put(decisions_key(app_name), self._log.to_json(), overwrite=True)
            if self._counter is None:
                self._counter = Counter(
                    "pdserve_planner_decisions",
                    description="Pool resizes the planner decided, by pool, direction, reason.",
                    tag_keys=("pool", "direction", "reason"),
                )
            self._counter.inc(1.0, tags={"pool": pool, "direction": direction, "reason": reason})
        except Exception as e:  # the record is best effort; the decision stands
            logger.debug("planner decision not recorded: %s", e)
