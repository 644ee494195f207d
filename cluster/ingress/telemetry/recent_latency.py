"""Recent latency percentiles at the ingress: what the ``slo`` planner corrects its model by.

Prometheus histograms answer "since the start"; the planner needs "lately". A
:class:`RecentLatency` keeps the samples of the last ``window_s`` seconds (at most
``max_samples``, the newest kept — inter-token gaps arrive by the thousand per second) and
answers their percentile; ``None`` while the window is empty, so an idle ingress reports no
latency rather than a zero that would read as "far within target".
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np


class RecentLatency:
    """Samples of one latency over a sliding time window."""

    def __init__(self, window_s: float = 30.0, max_samples: int = 4096) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def observe(self, seconds: float, now_s: float | None = None) -> None:
        self._samples.append((time.monotonic() if now_s is None else now_s, seconds))

    def percentile(self, q: float, now_s: float | None = None) -> float | None:
        """The ``q``-th percentile (0-100) of the window's samples; None when there are none."""
        now_s = time.monotonic() if now_s is None else now_s
        while self._samples and self._samples[0][0] < now_s - self.window_s:
            self._samples.popleft()
        if not self._samples:
            return None
        return float(np.percentile([value for _, value in self._samples], q))
