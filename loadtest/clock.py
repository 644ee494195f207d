"""The load tester's clock: the running asyncio event loop's.

Every timestamp a run takes (arrivals, a request's start, each token's arrival, fault times)
and every wait it makes goes through the event loop (``loop.time()``, ``asyncio.sleep``), so the
loop is the clock: monotonic on a normal loop, and under test a virtual-time loop injects its
own time, making the measured latencies exact instead of wall-clock approximations.
"""

from __future__ import annotations

import asyncio


def now_s() -> float:
    """Seconds on the running event loop's clock (call from a coroutine)."""
    return asyncio.get_running_loop().time()
