"""Gangs of engines: what wraps an :class:`~engine.engine.LLMEngine` so that several ranks run
as one — the tensor-parallel gang of local processes (rank 0 plans, the followers run its
forward) and the expert-parallel lockstep (a stepper every rank steps together, the driver
that serves it to :class:`~engine.async_engine.AsyncEngine`). Built by
:func:`engine.engine_builder.build_engine`."""

from engine.gangs.ep_builder import build_ep_stepper
from engine.gangs.ep_stepper import EPStepper, LockstepOutput, SteppableEngine
from engine.gangs.lockstep_driver import LockstepDriver, build_lockstep_driver, expert_load_stats
from engine.gangs.tp_gang import build_tp_engine

__all__ = [
    "EPStepper",
    "LockstepDriver",
    "LockstepOutput",
    "SteppableEngine",
    "build_ep_stepper",
    "build_lockstep_driver",
    "build_tp_engine",
    "expert_load_stats",
]
