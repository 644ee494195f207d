"""What a decode step measurably costs, fitted from the engine's own step timings.

A decode-only step of ``rows`` requests, ``verify_rows`` of them with drafts and
``draft_tokens`` drafts in all, is modelled as

    seconds = base + per_row * rows + per_verify_row * verify_rows + per_draft * draft_tokens

and the four coefficients are a least-squares fit over the most recent steps (a sliding window,
refitted every few records). ``per_verify_row`` carries what a speculating request costs
whatever its length (proposing, the host-side rejection sampler); ``per_draft`` what each draft
adds to the forward. Nothing here is a guessed constant about the hardware: on a memory-bound
GPU ``per_draft`` comes out near zero, on a CPU it is a good share of ``per_row``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

_WINDOW = 512
"""Steps the fit remembers (the newest)."""
_MIN_STEPS = 16
"""Steps recorded before any fit is trusted."""
_REFIT_EVERY = 8
"""Records between two fits (a fit is a small least-squares solve)."""


@dataclass(frozen=True)
class StepCostFit:
    """The fitted coefficients of a decode step's seconds (see the module docstring)."""

    base_s: float
    per_row_s: float
    per_verify_row_s: float
    per_draft_s: float

    def plain_step_s(self, num_rows: int) -> float:
        """Seconds of a step of ``num_rows`` decodes without drafts."""
        return self.base_s + self.per_row_s * num_rows

    def drafting_s(self, num_draft_tokens: int) -> float:
        """Seconds one request's verify row of ``num_draft_tokens`` drafts adds to a step."""
        return max(0.0, self.per_verify_row_s + self.per_draft_s * num_draft_tokens)

    def pays(self, num_rows: int, num_draft_tokens: int, expected_accepted: float) -> bool:
        """Whether drafting ``num_draft_tokens`` tokens that keep ``expected_accepted`` of them
        raises a step of ``num_rows`` requests' tokens per second: the extra tokens per extra
        second beat the step's rate without drafts (at batch 1 that is its TPOT)."""
        step_s = self.plain_step_s(num_rows)
        if step_s <= 0.0:
            return True  # a fit this noisy says nothing; speculation stays on
        return expected_accepted * step_s > self.drafting_s(num_draft_tokens) * num_rows


class StepCosts:
    """The recent decode steps' timings and their fit; one per engine (engine thread only)."""

    def __init__(self) -> None:
        self._steps: deque[tuple[int, int, int, float]] = deque(maxlen=_WINDOW)
        self._since_fit = 0
        self._fit: StepCostFit | None = None

    @property
    def num_steps(self) -> int:
        """Steps in the window."""
        return len(self._steps)

    def record(
        self, num_rows: int, num_verify_rows: int, num_draft_tokens: int, seconds: float
    ) -> None:
        """One decode-only step and how long it took (host wall clock, proposals included)."""
        if num_rows <= 0 or seconds <= 0.0:
            return
        self._steps.append((num_rows, num_verify_rows, num_draft_tokens, seconds))
        self._since_fit += 1
        if self._since_fit >= _REFIT_EVERY and len(self._steps) >= _MIN_STEPS:
            self._fit = _fit(self._steps)
            self._since_fit = 0

    def estimate(self) -> StepCostFit | None:
        """The latest fit; None until enough steps, with and without drafts, were seen."""
        return self._fit


def _fit(steps: deque[tuple[int, int, int, float]]) -> StepCostFit | None:
    """Least squares over ``steps``; None when they never varied in drafts (drafting's cost
    cannot be told apart from the rest)."""
    data = np.asarray(steps, dtype=np.float64)  # [N, 4]: rows, verify rows, drafts, seconds
    if np.ptp(data[:, 2]) == 0:
        return None
    design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1], data[:, 2]])  # [N, 4]
    # NOTE: lstsq's minimum-norm answer splits collinear columns (a batch size that never
    # changed) evenly; predictions inside what was measured stay right.
    coeffs, *_ = np.linalg.lstsq(design, data[:, 3], rcond=None)
    return StepCostFit(*(float(c) for c in coeffs))
