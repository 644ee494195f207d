"""Load prediction for the ``slo`` planner: where a signal will be one start-up time from now.

A new replica takes a while to load its model and warm up, so sizing for the load of this
moment is late on a ramp. :class:`TrendPredictor` keeps the last ``window_s`` seconds of one
signal (arrival tokens/s, running sequences) and extrapolates its least-squares trend over the
horizon — upward only: a falling signal is sized for as it is now, so a dip predicted to
continue never removes replicas ahead of time (Serve's downscale delay then smooths the rest).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class TrendPredictor:
    """One signal's recent samples and their upward trend."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def observe(self, now_s: float, value: float) -> None:
        """Add a sample and forget those older than the window."""
        self._samples.append((now_s, value))
        while self._samples and self._samples[0][0] < now_s - self.window_s:
            self._samples.popleft()

    def predict(self, horizon_s: float) -> float:
        """The latest value, raised by the trend over ``horizon_s`` when the trend is rising."""
        if not self._samples:
            return 0.0
        latest = self._samples[-1][1]
        if horizon_s <= 0 or len(self._samples) < 3:
            return latest
        times = np.array([t for t, _ in self._samples])
        if times[-1] - times[0] <= 0:
            return latest
        values = np.array([v for _, v in self._samples])
        slope = float(np.polyfit(times - times[0], values, 1)[0])
        return max(latest, latest + slope * horizon_s, 0.0)
