"""The one construction door: which engine a caller gets for a model, an engine config and a gang.

:func:`build_engine` decides, and is the only place that does: a plain
:class:`~engine.engine.LLMEngine` on this process's device; rank 0 of a local tensor-parallel
gang when ``engine.tensor_parallel_size > 1`` (:func:`~engine.gangs.tp_gang.build_tp_engine`);
one rank of an expert-parallel gang stepped in lockstep when ``gang`` says so
(:func:`~engine.gangs.lockstep_driver.build_lockstep_driver`). The offline :class:`~engine.llm.LLM`
takes its engine, :func:`build_async_engine` wraps it (and its step driver) in an
:class:`~engine.async_engine.AsyncEngine` for the roles and the Serve gang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.config import EngineConfig, EPLBConfig, ModelConfig
from core.errors import ConfigError
from core.kv_events import KVEventBatch
from engine.async_engine import AsyncEngine, StepDriver
from engine.engine import LLMEngine
from engine.expert_parallel.collective import EPCollective
from engine.gangs.lockstep_driver import DEFAULT_MAX_IDLE_S, build_lockstep_driver
from engine.gangs.tp_gang import build_tp_engine
from engine.setup import build_engine_parts


@dataclass(frozen=True)
class ExpertParallelGang:
    """This process's place in an expert-parallel gang it has already joined."""

    collective: EPCollective
    eplb: EPLBConfig | None = None
    max_idle_s: float = DEFAULT_MAX_IDLE_S  # the lockstep driver's longest idle wait


@dataclass(frozen=True)
class BuiltEngine:
    """An engine and what steps it: None: the engine steps itself (``engine.step()``)."""

    engine: LLMEngine
    driver: StepDriver | None = None


def build_engine(
    model: ModelConfig,
    engine: EngineConfig,
    *,
    gang: ExpertParallelGang | None = None,
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    shared_kv: bool = False,
) -> BuiltEngine:
    """The engine for ``model`` and ``engine`` (``shared_kv``: its KV's host bytes readable by
    same-node peers). With ``gang`` this is collective: every rank of the gang must call it.

    Raises :class:`ConfigError` for an expert-parallel rank asked for shared KV (not offered).
    """
    if gang is not None:
        if shared_kv:
            raise ConfigError(
                "an expert-parallel rank's KV is not shared with same-node peers",
                param="transfer.same_node",
            )
        driver = build_lockstep_driver(
            model,
            engine,
            gang.collective,
            kv_event_callback=kv_event_callback,
            max_idle_s=gang.max_idle_s,
            eplb=gang.eplb,
        )
        return BuiltEngine(driver.stepper.engine, driver)
    if engine.tensor_parallel_size > 1:  # rank 0 of a local gang; closing the engine stops it
        tp_engine = build_tp_engine(
            model, engine, kv_event_callback=kv_event_callback, shared_kv=shared_kv
        )
        return BuiltEngine(tp_engine)
    parts = build_engine_parts(
        model, engine, kv_event_callback=kv_event_callback, shared_kv=shared_kv
    )
    return BuiltEngine(LLMEngine(parts))


def build_async_engine(
    model: ModelConfig,
    engine: EngineConfig,
    *,
    gang: ExpertParallelGang | None = None,
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    shared_kv: bool = False,
) -> AsyncEngine:
    """:func:`build_engine`'s engine on its own thread, stepped by its driver if it has one."""
    built = build_engine(
        model, engine, gang=gang, kv_event_callback=kv_event_callback, shared_kv=shared_kv
    )
    return AsyncEngine(built.engine, driver=built.driver)
