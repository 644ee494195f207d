"""One rank of an expert-parallel gang served to asyncio code: an ``AsyncEngine`` in lockstep.

:class:`LockstepDriver` plugs an :class:`~engine.gangs.ep_stepper.EPStepper` into
:class:`~engine.async_engine.AsyncEngine` as its :class:`~engine.async_engine.StepDriver`: the
engine thread steps the gang continuously (so the peers' collectives always pair up), between
steps it runs the queued commands (add, abort, KV import, ...) exactly as a single engine does.

Idle pacing: while no rank of the gang has work, the thread waits for a command between steps,
``min_idle_s`` after the first idle step, doubling up to ``max_idle_s``. The choice is made from
the step's own agreement all-reduce (``gang_busy``), which every rank sees alike, so every rank
follows the same schedule and an idle gang costs a few wake-ups a second. A rank that gets a
command steps at once and waits in the all-reduce for its peers' next wake-up: a new request
starts within ``max_idle_s``. ``max_idle_s`` must stay well under the process group's timeout.

A collective that fails (a peer died or stalled) breaks the gang for good: the driver turns
unusable, the engine thread fails every request with ``UnavailableError`` and stops, and the
replica reports unhealthy so the whole gang is restarted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from core.config import EngineConfig, EPLBConfig, ModelConfig
from core.errors import ConfigError, UnavailableError
from core.kv_events import KVEventBatch
from core.stats import ExpertLoadStats
from engine.async_engine import AsyncEngine
from engine.builtin import resolve_model
from engine.engine import LLMEngine
from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.placement import ExpertPlacement
from engine.gangs.ep_builder import build_ep_stepper
from engine.gangs.ep_stepper import EPStepper
from engine.models import ModelArchConfig
from engine.outputs import RequestOutput

logger = logging.getLogger(__name__)

DEFAULT_MIN_IDLE_S = 0.002
DEFAULT_MAX_IDLE_S = 0.05


class LockstepDriver:
    """Steps one rank's :class:`EPStepper` for an :class:`AsyncEngine`, with idle backoff."""

    def __init__(
        self,
        stepper: EPStepper[LLMEngine],
        *,
        min_idle_s: float = DEFAULT_MIN_IDLE_S,
        max_idle_s: float = DEFAULT_MAX_IDLE_S,
    ) -> None:
        if not 0.0 < min_idle_s <= max_idle_s:
            raise ConfigError(
                f"idle backoff needs 0 < min_idle_s ({min_idle_s}) <= max_idle_s ({max_idle_s})",
                param="min_idle_s",
            )
        self.stepper = stepper
        self._min_idle_s = min_idle_s
        self._max_idle_s = max_idle_s
        self._idle_s = 0.0  # 0: the last step was busy (or none ran yet): step again at once
        self._usable = True
        self.num_steps = 0
        self.num_idle_steps = 0

    @property
    def rank(self) -> int:
        """This rank in its gang."""
        return self.stepper.collective.rank

    @property
    def usable(self) -> bool:
        """False once a collective failed or the gang was asked to stop."""
        return self._usable

    def wait_s(self) -> float:
        """0 while the gang is busy; else the current idle backoff."""
        return self._idle_s

    def step(self) -> list[RequestOutput]:
        """One lockstep step; raises :class:`UnavailableError` (and turns unusable) when the
        gang broke or stopped."""
        try:
            result = self.stepper.step()
        except UnavailableError:
            self._usable = False
            raise
        self.num_steps += 1
        if result.stop_requested:
            self._usable = False
            raise UnavailableError(f"expert-parallel rank {self.rank}: the gang is stopping")
        if result.gang_busy:
            self._idle_s = 0.0
        else:
            self.num_idle_steps += 1
            self._idle_s = min(max(2 * self._idle_s, self._min_idle_s), self._max_idle_s)
        return result.outputs

    def close(self) -> None:
        """Leave the gang (the peers' next collective fails)."""
        self._usable = False
        self.stepper.collective.close()


def build_lockstep_driver(
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    collective: EPCollective,
    *,
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    max_idle_s: float = DEFAULT_MAX_IDLE_S,
    eplb: EPLBConfig | None = None,
) -> LockstepDriver:
    """This rank's engine (its experts of a contiguous placement) in the driver that steps it in
    lockstep with the gang (the engine is ``driver.stepper.engine``). Collective: every rank of
    the gang must call it.

    Raises :class:`ConfigError` for a model without experts or with fewer experts than ranks.
    """
    arch = ModelArchConfig.from_dir(resolve_model(model_cfg.name))
    world_size = collective.world_size
    if arch.num_experts < world_size:
        raise ConfigError(
            f"expert_parallel {world_size} needs a MoE model with at least {world_size} experts; "
            f"{model_cfg.name} has {arch.num_experts}",
            param="expert_parallel",
        )
    placement = ExpertPlacement.contiguous(arch.num_experts, world_size)
    stepper = build_ep_stepper(
        model_cfg,
        engine_cfg,
        collective,
        placement,
        kv_event_callback=kv_event_callback,
        eplb=eplb,
    )
    logger.info(
        "expert-parallel rank %s/%s ready with experts %s",
        collective.rank,
        world_size,
        list(placement.experts_of(collective.rank)),
    )
    return LockstepDriver(stepper, max_idle_s=max_idle_s)


def expert_load_stats(engine: AsyncEngine) -> ExpertLoadStats | None:
    """Expert load of an expert-parallel engine (None for a plain one): this rank, its
    lockstep steps, the tokens its experts computed and their imbalance (hottest over mean).
    Read off the engine thread: a gauge may lag a step behind."""
    driver = engine.driver
    if not isinstance(driver, LockstepDriver):
        return None
    snapshot = driver.stepper.ep_model.stats.snapshot()
    return ExpertLoadStats(
        rank=driver.rank,
        steps_total=driver.num_steps,
        idle_steps_total=driver.num_idle_steps,
        expert_tokens_total=int(sum(snapshot["total_tokens_per_expert"])),
        imbalance=float(snapshot["load_imbalance"]),
        all_to_all_bytes_total=int(snapshot["total_all_to_all_bytes"]),
    )
