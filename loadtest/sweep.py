"""Sweep mode: rerun the same sessions at rising load and find the throughput knee.

Load is ``max_concurrency`` or ``request_rate`` (``SweepConfig.mode``), at the given values or
doubling from 1 for up to ``max_steps`` levels. Throughput is the request goodput when SLOs are
set, else the request throughput. Step ``i`` *scales* when its relative throughput gain is at
least ``min_gain`` times its relative load increase,
``thr_i / thr_{i-1} - 1 >= min_gain * (load_i / load_{i-1} - 1)``. The knee is the last level
before the first step that does not scale: beyond it, extra load mostly adds queueing. Doubling
sweeps stop at the first such step; a knee of None means every step still scaled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loadtest.bench import BenchOutput, ReportOptions, run_benchmark
from loadtest.config import LoadTestConfig, SweepConfig
from loadtest.session_driver import OnDone
from loadtest.tokens import TokenCounter
from loadtest.types import Session

OnLevel = Callable[[float, BenchOutput], None]


@dataclass(frozen=True)
class SweepResult:
    """Every level's run and the knee (an index into ``outputs``)."""

    mode: str
    loads: tuple[float, ...]
    outputs: tuple[BenchOutput, ...]
    knee_index: int | None
    throughput_metric: str

    def to_dict(self) -> dict[str, Any]:
        """The sweep summary JSON: one row per level plus the knee."""
        keys = (
            "request_throughput",
            "request_goodput",
            "output_throughput",
            "failed",
            "mean_ttft_ms",
            "mean_tpot_ms",
            "mean_itl_ms",
            "mean_e2el_ms",
        )
        levels = []
        for load, output in zip(self.loads, self.outputs, strict=True):
            s = output.summary
            levels.append({"load": load, **{k: s.get(k) for k in keys}})
        knee = None if self.knee_index is None else self.loads[self.knee_index]
        return {
            "mode": self.mode,
            "throughput_metric": self.throughput_metric,
            "levels": levels,
            "knee_index": self.knee_index,
            "knee_load": knee,
        }


def first_non_scaling_step(
    loads: Sequence[float], throughputs: Sequence[float], min_gain: float
) -> int | None:
    """Index ``i >= 1`` of the first step that does not scale, or None."""
    for i in range(1, len(loads)):
        load_gain = loads[i] / loads[i - 1] - 1.0
        if throughputs[i - 1] <= 0.0:
            continue
        if throughputs[i] / throughputs[i - 1] - 1.0 < min_gain * load_gain:
            return i
    return None


def find_knee(loads: Sequence[float], throughputs: Sequence[float], min_gain: float) -> int | None:
    """The knee's index: the level before the first non-scaling step; None if none yet."""
    step = first_non_scaling_step(loads, throughputs, min_gain)
    return None if step is None else step - 1


def _at_load(config: LoadTestConfig, mode: str, load: float) -> LoadTestConfig:
    field = {"max_concurrency": int(load)} if mode == "concurrency" else {"request_rate": load}
    arrivals = config.arrivals.model_copy(update=field)
    return config.model_copy(update={"arrivals": arrivals})


async def run_sweep(
    config: LoadTestConfig,
    sweep: SweepConfig,
    sessions: Sequence[Session],
    counter: TokenCounter,
    *,
    report: ReportOptions | None = None,
    api_key: str | None = None,
    on_done: OnDone | None = None,
    on_level: OnLevel | None = None,
) -> SweepResult:
    """Run every level (stopping early past the knee when doubling) and locate the knee."""
    metric = "request_goodput" if config.slo.model_dump(exclude_none=True) else "request_throughput"
    planned = sweep.values or [float(2**i) for i in range(sweep.max_steps)]
    loads: list[float] = []
    outputs: list[BenchOutput] = []
    for load in planned:
        output = await run_benchmark(
            _at_load(config, sweep.mode, load),
            sessions,
            counter,
            report=report,
            api_key=api_key,
            on_done=on_done,
        )
        loads.append(load)
        outputs.append(output)
        if on_level is not None:
            on_level(load, output)
        throughputs = [float(o.summary.get(metric) or 0.0) for o in outputs]
        stalled = first_non_scaling_step(loads, throughputs, sweep.min_gain) is not None
        if sweep.values is None and stalled:
            break
    throughputs = [float(o.summary.get(metric) or 0.0) for o in outputs]
    return SweepResult(
        mode=sweep.mode,
        loads=tuple(loads),
        outputs=tuple(outputs),
        knee_index=find_knee(loads, throughputs, sweep.min_gain),
        throughput_metric=metric,
    )
