"""Fail over to local prefill on the first failed remote call, not after the board notices.

The stats board learns that a prefill replica died only when its reports stop (a few seconds),
and Serve's router keeps picking the dead replica until its controller does. Meanwhile every
request sent to the pool pays a failed call. :class:`PrefillBreaker` opens on the first remote
prefill that fails for lack of capacity (the replica died, the pool is unavailable, the call
timed out): for ``cooldown_s`` the pool counts as unhealthy, so the disaggregation policy sends
prompts to local prefill at once. After the cooldown one request probes the pool again; a
success closes the breaker, another failure opens it for a new cooldown.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PrefillBreaker:
    """Open for ``cooldown_s`` after a failed remote prefill (see the module docstring)."""

    def __init__(self, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._open_until = 0.0
        self.trips_total = 0
        """Times the breaker opened (``pdserve:prefill_failovers_total``)."""

    @property
    def is_open(self) -> bool:
        """True while remote prefill should be skipped."""
        return self._clock() < self._open_until

    def allows(self, pool_healthy: bool) -> bool:
        """Whether a request may try the prefill pool now."""
        return pool_healthy and not self.is_open

    def failed(self) -> None:
        """A remote prefill failed for lack of capacity: open (again) for the cooldown."""
        if not self.is_open:
            self.trips_total += 1
        self._open_until = self._clock() + self._cooldown_s

    def succeeded(self) -> None:
        """A remote prefill worked: close."""
        self._open_until = 0.0
