"""An asyncio event loop whose clock is virtual: waiting costs no real time.

:class:`VirtualTimeLoop` is a selector loop whose ``time()`` is a counter. When nothing is ready
to run and no I/O is pending, it jumps the counter to the next timer instead of sleeping, so
``asyncio.sleep(0.2)`` returns at once with ``loop.time()`` exactly 0.2 s later. Real socket I/O
between coroutines on the same loop (a client and a fake server over loopback) still flows:
before each jump the selector is polled briefly for readiness, so time never moves while bytes
are on their way. Timing measured on such a loop is exact, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

_IO_GRACE_S = 0.002
"""Real time a quiet selector is given before the clock jumps (loopback bytes in flight)."""


class _JumpingSelector(selectors.DefaultSelector):
    """Polls for real; where the loop would sleep, advances its virtual clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        ready = super().select(_IO_GRACE_S)
        if ready:
            return ready
        if timeout is None:  # no timer at all: only real I/O can wake the loop
            return super().select(None)
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on virtual time (starts at 0)."""

    def __init__(self) -> None:
        self._now_s = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        """The virtual clock."""
        return self._now_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the selector does, instead of sleeping)."""
        self._now_s += max(seconds, 0.0)


def run_virtual(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion on a fresh :class:`VirtualTimeLoop`."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
