"""Arrival times: a gamma-renewal process (Poisson at burstiness 1), with optional ramp-up.

Gaps between arrivals are ``Gamma(shape=burstiness, scale=1 / (rate x burstiness))``: the mean
gap is ``1 / rate`` whatever the burstiness, and the squared coefficient of variation of the
gaps is ``1 / burstiness`` (below 1: bursty, above 1: smoother, inf: evenly spaced). As in
``vllm bench serve``, the first arrival comes one gap after the start, and ``rate = inf`` sends
everything at time 0. A ramp-up moves the rate from ``ramp_up_start_rps`` to ``ramp_up_end_rps``
(linearly or geometrically) over the request count, or over ``duration_s`` when one is set.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from loadtest.config import ArrivalConfig


def rate_at(cfg: ArrivalConfig, progress: float) -> float:
    """The request rate at ``progress`` in [0, 1] of the run (constant without a ramp-up)."""
    if cfg.ramp_up_strategy is None:
        return cfg.request_rate
    start = float(cfg.ramp_up_start_rps or 0.0)
    end = float(cfg.ramp_up_end_rps or start)
    progress = min(max(progress, 0.0), 1.0)
    if cfg.ramp_up_strategy == "linear":
        return start + (end - start) * progress
    return start * (end / start) ** progress


def _gap_s(rate: float, burstiness: float, rng: np.random.Generator) -> float:
    if math.isinf(rate):
        return 0.0
    if rate <= 0.0:
        return 0.0  # a linear ramp from 0 rps: the first request goes at once
    if math.isinf(burstiness):
        return 1.0 / rate
    return float(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)))


def arrival_times(cfg: ArrivalConfig, rng: np.random.Generator) -> Iterator[float]:
    """Endless arrival offsets in seconds from the start, non-decreasing."""
    now_s = 0.0
    denominator = max(cfg.num_requests - 1, 1)
    for index in itertools.count():
        progress = now_s / cfg.duration_s if cfg.duration_s else index / denominator
        now_s += _gap_s(rate_at(cfg, progress), cfg.burstiness, rng)
        yield now_s
