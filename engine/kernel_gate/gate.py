"""The compile gate: plan every launch of every gate case for every target, compile each distinct
build once (in parallel, streaming builds to the workers while planning goes on) and check them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import torch

from core.config import EngineConfig
from engine.kernel_gate.builds import Build, build_spec, spec_key
from engine.kernel_gate.checks import findings
from engine.kernel_gate.compiler import BuildResult, compile_build
from engine.kernel_gate.plans import GATE_ENGINE_CONFIG, EngineCase, gate_cases, plan_case
from engine.triton_launch import KernelTarget, interpreter_active


@dataclass(frozen=True)
class GateRun:
    """Every distinct build with its result, the failed checks and how long it all took."""

    targets: tuple[KernelTarget, ...]
    builds: list[Build]
    results: list[BuildResult]
    findings: list[str]
    num_launches: int
    wall_s: float


def run_gate(
    targets: Sequence[KernelTarget],
    workers: int,
    cases: Sequence[EngineCase] | None = None,
    engine_cfg: EngineConfig | None = None,
) -> GateRun:
    """Plan, compile and check ``cases`` (default: :func:`gate_cases`) on ``targets`` for the
    step sizes of ``engine_cfg`` (default: the gate's), in ``workers`` compile processes."""
    if interpreter_active():
        raise RuntimeError(
            "the compile gate needs compiled kernels: run it without TRITON_INTERPRET set"
        )
    start = time.perf_counter()
    # spawned, not forked: each worker imports triton and the kernels afresh
    context = multiprocessing.get_context("spawn")
    with _one_torch_thread(), ProcessPoolExecutor(max(workers, 1), mp_context=context) as pool:
        builds, futures, num_launches = _plan_and_submit(
            pool, targets, cases or gate_cases(), engine_cfg or GATE_ENGINE_CONFIG
        )
        results = [future.result() for future in futures]
    return GateRun(
        tuple(targets),
        builds,
        results,
        findings(builds, results, targets),
        num_launches,
        time.perf_counter() - start,
    )


def _plan_and_submit(
    pool: ProcessPoolExecutor,
    targets: Sequence[KernelTarget],
    cases: Sequence[EngineCase],
    engine_cfg: EngineConfig,
) -> tuple[list[Build], list[Future[BuildResult]], int]:
    """Plan every case on every target; submit each distinct build once, as it turns up."""
    builds: dict[str, Build] = {}
    futures: list[Future[BuildResult]] = []
    num_launches = 0
    for target in targets:
        for case in cases:
            for launch in plan_case(case, target, engine_cfg):
                num_launches += 1
                spec = build_spec(launch, target)
                build = builds.get(spec_key(spec))
                if build is None:
                    build = builds[spec_key(spec)] = Build(spec)
                    futures.append(pool.submit(compile_build, spec))
                build.cases.add(case.label)
    return list(builds.values()), futures, num_launches


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Planning runs a few torch ops (the MoE row layout) beside the compile workers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
