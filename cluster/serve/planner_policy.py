"""pdserve's planner as Ray Serve's application-level autoscaling policy.

Serve (2.60) calls :class:`PdservePlanner` on its controller every autoscaling tick with an
``AutoscalingContext`` per deployment of the app; each pool's replicas report the planner's
inputs through ``record_autoscaling_stats`` (``replica.lifecycle``), which Serve averages over
the look-back window into ``ctx.aggregated_metrics[name][replica]``. The planner turns both
pools' load into targets in one decision (``cluster.planner.load_policy``); Serve clamps each to
the pool's ``autoscaling`` range and applies its delays. Every change is logged with its reason
and counted as ``pdserve_planner_decisions`` (Ray metrics, tagged pool, direction, reason);
the last decision per pool is kept in the policy state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cluster.planner.load_policy import PoolDecision, PoolLoad, plan_decode, plan_prefill
from cluster.serve.pool_options import DECODE_DEPLOYMENT, PREFILL_DEPLOYMENT
from core.config import PlannerConfig

logger = logging.getLogger(__name__)

POLICY_FUNCTION = "cluster.serve.planner_policy:PdservePlanner"
"""The import path Serve loads the policy class from."""


def pool_load(ctx: Any) -> PoolLoad:
    """A pool's :class:`PoolLoad` from its Serve ``AutoscalingContext``."""
    metrics: Mapping[str, Mapping[Any, float]] = ctx.aggregated_metrics or {}

    def total(name: str) -> float:
        return float(sum(metrics.get(name, {}).values()))

    usages = list(metrics.get("kv_usage", {}).values())
    return PoolLoad(
        num_replicas=int(ctx.current_num_replicas),
        pending_prompt_tokens=total("pending_prompt_tokens"),
        kv_usage=sum(usages) / len(usages) if usages else 0.0,
        running=total("running"),
        waiting=total("waiting"),
    )


class PdservePlanner:
    """The policy object Serve instantiates once with ``policy_kwargs`` (the planner config)."""

    def __init__(self, **config: Any) -> None:
        self.config = PlannerConfig.model_validate(config)
        self._counter: Any = None

    def __call__(self, contexts: Mapping[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        """Both pools' targets and their policy state; other deployments keep theirs."""
        targets: dict[Any, int] = {}
        state: dict[Any, dict] = {}
        for deployment_id, ctx in contexts.items():
            name = deployment_id.name
            if name not in (PREFILL_DEPLOYMENT, DECODE_DEPLOYMENT):
                targets[deployment_id] = int(ctx.target_num_replicas)
                continue
            load = pool_load(ctx)
            plan = plan_prefill if name == PREFILL_DEPLOYMENT else plan_decode
            decision = plan(load, self.config)
            targets[deployment_id] = decision.target
            state[deployment_id] = {"target": decision.target, "reason": decision.reason.value}
            self._record(name, load, decision)
        return targets, state

    def _record(self, pool: str, load: PoolLoad, decision: PoolDecision) -> None:
        direction = decision.direction(load.num_replicas)
        if direction == "hold":
            return
        logger.info(
            "planner: %s %s %d -> %d (%s; load %s)",
            pool, direction, load.num_replicas, decision.target, decision.reason.value, load,
        )  # fmt: skip
        try:
            if self._counter is None:
                from ray.util.metrics import Counter

                self._counter = Counter(
                    "pdserve_planner_decisions",
                    description="Pool resizes the planner decided, by pool, direction, reason.",
                    tag_keys=("pool", "direction", "reason"),
                )
            tags = {"pool": pool, "direction": direction, "reason": decision.reason.value}
            self._counter.inc(1.0, tags=tags)
        except Exception as e:  # metrics are best effort; the decision stands
            logger.debug("planner metric not recorded: %s", e)
