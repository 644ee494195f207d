"""Lockstep stepping of an expert-parallel gang: every rank runs every forward together.

Each :meth:`EPStepper.step` starts with one tiny all-reduce in which the ranks agree whether
any of them has work (and whether any asked to stop). If none has, nobody runs a forward. If
any has, every rank runs exactly one forward: its engine's real step, or — when it has no work
or its scheduler scheduled nothing (e.g. waiting for imported KV) — an empty forward through the
MoE collectives. So the collectives always pair up and never deadlock.

A rank's loop must call :meth:`EPStepper.step` regularly even when idle (well within the process
group timeout), since its peers wait in the agreement all-reduce. A peer that died or stalled
makes the collectives raise :class:`~core.errors.UnavailableError`: the gang must be restarted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from engine.expert_parallel.balancer import ExpertLoadBalancer
from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.install import ExpertParallelModel
from engine.outputs import RequestOutput

logger = logging.getLogger(__name__)


class SteppableEngine(Protocol):
    """What the stepper drives: :class:`~engine.engine.LLMEngine` satisfies it."""

    def has_unfinished(self) -> bool:
        """True while a request is queued, running or waiting for KV."""
        ...

    def step(self) -> list[RequestOutput]:
        """One scheduler step (at most one model forward)."""
        ...


EngineT = TypeVar("EngineT", bound=SteppableEngine)


@dataclass(frozen=True)
class LockstepOutput:
    """What one lockstep step did on this rank."""

    outputs: list[RequestOutput] = field(default_factory=list)
    gang_busy: bool = False  # some rank had work: every rank ran one forward
    ran_empty: bool = False  # this rank's forward was an empty step
    stop_requested: bool = False  # some rank asked the gang to stop: no forward ran


class EPStepper(Generic[EngineT]):
    """Drives one rank's engine in lockstep with the other ranks of its gang."""

    def __init__(
        self,
        engine: EngineT,
        ep_model: ExpertParallelModel,
        collective: EPCollective,
        *,
        balancer: ExpertLoadBalancer | None = None,
    ) -> None:
        self.engine = engine
        self.ep_model = ep_model
        self.collective = collective
        self.balancer = balancer
        self._stop = False

    def request_stop(self) -> None:
        """Ask the gang to stop: from the next step on, every rank's step reports it."""
        self._stop = True

    def step(self) -> LockstepOutput:
        """Agree with the peers, then run this rank's forward (real or empty) if any has work."""
        has_work = self.engine.has_unfinished()
        any_work, any_stop = self.collective.all_reduce_max([int(has_work), int(self._stop)])
        if any_stop:
            return LockstepOutput(stop_requested=True)
        if not any_work:
            return LockstepOutput()
        started = self.ep_model.num_forwards
        try:
            outputs = self.engine.step() if has_work else []
        except Exception:
            if self.ep_model.num_forwards == started:
                logger.warning(
                    "expert-parallel rank %s: step failed before its forward; running an empty "
                    "step so the peers' step completes",
                    self.collective.rank,
                )
                self.ep_model.empty_forward()
            raise
        ran_empty = self.ep_model.num_forwards == started
        if ran_empty:
            self.ep_model.empty_forward()
        if self.balancer is not None:
            self.balancer.after_busy_step()  # between forwards, on every rank at the same step
        return LockstepOutput(outputs=outputs, gang_busy=True, ran_empty=ran_empty)

    def run_until_idle(self, *, max_steps: int = 1_000_000) -> list[RequestOutput]:
        """Step until no rank has work (or one asks to stop); every rank returns on the same
        step. Returns this rank's outputs. ``max_steps`` bounds the loop."""
        outputs: list[RequestOutput] = []
        for _ in range(max_steps):
            result = self.step()
            outputs.extend(result.outputs)
            if not result.gang_busy:
                return outputs
        logger.warning(
            "expert-parallel rank %s: still busy after %s steps", self.collective.rank, max_steps
        )
        return outputs
