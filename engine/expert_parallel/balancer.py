"""The gang's expert load balancer: every N lockstep steps, re-plan redundant copies and switch.

:class:`ExpertLoadBalancer` counts the busy lockstep steps (every rank runs every busy step, so
the count is the same on every rank) and, every ``rebalance_interval_steps`` of them, between
two forwards and on every rank at once:

1. gathers each rank's routed tokens per expert since the previous plan (an all-to-all of one
   [E] row per rank) and sums them, so every rank holds the gang's counts;
2. computes :func:`~engine.expert_parallel.rebalance_plan.rebalance_placement` from them
   (pure, deterministic);
3. checks with one all-reduce that every rank's plan has the same fingerprint;
4. if the plan changed, fetches new copies from their primaries and switches the routers
   (:func:`~engine.expert_parallel.reshard.apply_placement`).

No request is paused or dropped: the scheduler and the KV cache never see the switch.
"""

from __future__ import annotations

import logging
import time

import torch

from core.config import EPLBConfig
from engine.expert_parallel.agreement import check_placement_agreement
from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.install import ExpertParallelModel
from engine.expert_parallel.placement import ExpertPlacement
from engine.expert_parallel.rebalance_plan import check_copy_budget, rebalance_placement
from engine.expert_parallel.reshard import apply_placement

logger = logging.getLogger(__name__)


class ExpertLoadBalancer:
    """One rank's share of the gang's load balancing (all ranks must hold one, or none).

    Raises :class:`ConfigError` when ``config.redundant_experts`` does not fit the gang.
    """

    def __init__(
        self,
        ep_model: ExpertParallelModel,
        collective: EPCollective,
        placement: ExpertPlacement,
        config: EPLBConfig,
    ) -> None:
        check_copy_budget(placement, config.redundant_experts)
        self.ep_model = ep_model
        self.collective = collective
        self.placement = placement
        self.config = config
        self.num_busy_steps = 0
        self.num_rebalances = 0  # plans that changed the placement
        self._window_start = self._routed_totals()  # [E]

    def after_busy_step(self) -> bool:
        """Count a busy lockstep step; rebalance when the interval is up. True if it switched."""
        self.num_busy_steps += 1
        if self.num_busy_steps % self.config.rebalance_interval_steps:
            return False
        return self.rebalance()

    def reset_window(self) -> None:
        """Forget the counts so far: the next plan sees only the steps from now on."""
        self._window_start = self._routed_totals()

    def rebalance(self) -> bool:
        """Re-plan from the window's counts and switch if the plan changed. Collective."""
        start = time.perf_counter()
        totals = self._routed_totals()
        gang_tokens = self._gang_sum(totals - self._window_start)
        self._window_start = totals
        plan = rebalance_placement(self.placement, gang_tokens, self.config.redundant_experts)
        check_placement_agreement(self.collective, plan)
        if plan == self.placement:
            return False
        received_bytes = self.switch_to(plan)
        self.num_rebalances += 1
        logger.info(
            "expert-parallel rank %s: rebalanced at step %s to copies %s (%s bytes in, %.1f ms)",
            self.collective.rank,
            self.num_busy_steps,
            [list(ids) for ids in plan.redundant],
            received_bytes,
            1e3 * (time.perf_counter() - start),
        )
        return True

    def switch_to(self, plan: ExpertPlacement) -> int:
        """Hold and route by ``plan`` (same primaries) from the next step; bytes fetched.
        Collective: every rank calls it with the same plan between the same two steps."""
        received_bytes = apply_placement(self.ep_model, self.collective, self.placement, plan)
        self.placement = plan
        return received_bytes

    def _routed_totals(self) -> torch.Tensor:
        """This rank's routed tokens per expert so far, summed over MoE layers: [E] int64."""
        routed = self.ep_model.stats.snapshot()["total_routed_tokens_per_expert"]
        return torch.tensor(routed, dtype=torch.int64)

    def _gang_sum(self, counts: torch.Tensor) -> list[int]:
        """Every rank's ``counts`` [E] summed; the same list on every rank."""
        world = self.collective.world_size
        device = self.ep_model.model.embed_tokens.weight.device
        rows = counts.to(device).expand(world, -1)  # [R, E]: one copy for each peer
        gathered = self.collective.all_to_all(rows, [1] * world, [1] * world)  # [R, E]
        return [int(v) for v in gathered.sum(dim=0).tolist()]
