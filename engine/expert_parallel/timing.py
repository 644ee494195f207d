"""Step-time breakdown of an expert-parallel forward: attention / dispatch / experts / combine.

The EP MoE layers time their own phases; the model's forward hooks time the whole forward, and
everything outside the MoE phases (embedding, norms, attention, dense MLPs) is reported as
``attention``. Timing is opt-in (benchmarks): on CUDA it needs a device sync at every phase
boundary, which the caller passes as ``sync``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MOE_PHASES = ("dispatch", "experts", "combine")
PHASES = ("attention", *MOE_PHASES)


class StepTimer:
    """Accumulates wall time per phase over forward steps."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self._sync = sync
        self.num_steps = 0
        self.total_s = dict.fromkeys((*PHASES, "forward"), 0.0)
        self._step_start = 0.0
        self._moe_s = 0.0

    def reset(self) -> None:
        """Forget every step measured so far (e.g. after warm-up)."""
        self.num_steps = 0
        self.total_s = dict.fromkeys(self.total_s, 0.0)

    def begin_step(self) -> None:
        """A forward starts."""
        self._barrier()
        self._moe_s = 0.0
        self._step_start = time.perf_counter()

    def end_step(self) -> None:
        """The forward ended: its non-MoE time is booked as ``attention``."""
        self._barrier()
        forward_s = time.perf_counter() - self._step_start
        self.total_s["forward"] += forward_s
        self.total_s["attention"] += max(forward_s - self._moe_s, 0.0)
        self.num_steps += 1

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` body as MoE phase ``name`` (one of :data:`MOE_PHASES`)."""
        self._barrier()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._barrier()
            elapsed_s = time.perf_counter() - start
            self.total_s[name] += elapsed_s
            self._moe_s += elapsed_s

    def snapshot(self) -> dict[str, Any]:
        """Totals in seconds and per-step means in milliseconds, per phase."""
        steps = max(self.num_steps, 1)
        return {
            "num_steps": self.num_steps,
            "total_s": dict(self.total_s),
            "mean_step_ms": {k: 1e3 * v / steps for k, v in self.total_s.items()},
        }

    def _barrier(self) -> None:
        if self._sync is not None:
            self._sync()
