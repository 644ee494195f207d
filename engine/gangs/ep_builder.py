"""Build one rank of an expert-parallel engine: load only this rank's experts, install EP.

The composition the roles use: :func:`build_ep_stepper` loads the checkpoint with the experts
the placement gives this rank, swaps the MoE layers for expert-parallel ones, checks that every
rank of the gang uses the same placement, and returns the lockstep stepper around an ordinary
:class:`~engine.engine.LLMEngine` (its scheduler, KV cache and requests stay this rank's own).
"""

from __future__ import annotations

from collections.abc import Callable

from core.config import EngineConfig, EPLBConfig, ModelConfig
from core.errors import ConfigError
from core.kv_events import KVEventBatch
from engine.engine import LLMEngine
from engine.expert_parallel.agreement import check_placement_agreement
from engine.expert_parallel.balancer import ExpertLoadBalancer
from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.install import install_expert_parallel
from engine.expert_parallel.placement import ExpertPlacement
from engine.expert_parallel.timing import StepTimer
from engine.gangs.ep_stepper import EPStepper
from engine.setup import build_engine_parts


def build_ep_stepper(
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    collective: EPCollective,
    placement: ExpertPlacement,
    *,
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    timer: StepTimer | None = None,
    eplb: EPLBConfig | None = None,
) -> EPStepper[LLMEngine]:
    """This rank's engine with expert-parallel MoE layers, driven by an :class:`EPStepper`.

    Collective: one agreement round (the placement fingerprint), so every rank must call it.
    ``eplb`` with ``redundant_experts > 0`` adds an :class:`ExpertLoadBalancer` (the same
    config on every rank), whose plans keep ``placement``'s primaries.
    Raises :class:`ConfigError` for ``compile_model`` (collectives are not traced).
    """
    if engine_cfg.compile_model:
        raise ConfigError(
            "compile_model cannot be combined with expert parallelism", param="compile_model"
        )
    check_placement_agreement(collective, placement)
    parts = build_engine_parts(
        model_cfg,
        engine_cfg,
        kv_event_callback=kv_event_callback,
        expert_ids=placement.experts_of(collective.rank),
    )
    ep_model = install_expert_parallel(parts.model, collective, placement, timer=timer)
    balancer = None
    if eplb is not None and eplb.redundant_experts > 0:
        balancer = ExpertLoadBalancer(ep_model, collective, placement, eplb)
    return EPStepper(LLMEngine(parts), ep_model, collective, balancer=balancer)
