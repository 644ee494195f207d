"""The one way tests wait: poll a condition until it holds, or fail after a timeout.

The poll starts at 5 ms and backs off to 0.2 s, so a condition that holds soon is seen at once
and one that takes seconds (a replica restarting) is not hammered. A predicate that raises is
retried (the condition may be unreadable while things restart); on timeout the failure names
what was awaited and the last error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_FIRST_POLL_S = 0.005
_MAX_POLL_S = 0.2


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 5.0,
    message: str = "condition",
    poll_s: float = _MAX_POLL_S,
) -> T:
    """Poll ``predicate`` until it returns a truthy value, which is returned; raise
    ``AssertionError`` after ``timeout_s``. ``poll_s`` caps the interval between polls."""
    poll = _Poll(predicate, timeout_s, message, poll_s)
    while (pause_s := poll.next_pause_s()) is not None:
        time.sleep(pause_s)
    return poll.value


async def async_wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 5.0,
    message: str = "condition",
    poll_s: float = _MAX_POLL_S,
) -> T:
    """:func:`wait_until` on an event loop: the loop runs between polls."""
    poll = _Poll(predicate, timeout_s, message, poll_s)
    while (pause_s := poll.next_pause_s()) is not None:
        await asyncio.sleep(pause_s)
    return poll.value


class _Poll(Generic[T]):
    """One wait: each :meth:`next_pause_s` checks the predicate once."""

    def __init__(
        self, predicate: Callable[[], T], timeout_s: float, message: str, max_pause_s: float
    ) -> None:
        self._predicate = predicate
        self._deadline_s = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._message = message
        self._max_pause_s = max_pause_s
        self._pause_s = _FIRST_POLL_S
        self.value: T

    def next_pause_s(self) -> float | None:
        """None once the predicate holds (its value in :attr:`value`), else how long to pause;
        raises ``AssertionError`` past the deadline."""
        error: Exception | None = None
        try:
            value = self._predicate()
        except Exception as e:  # unreadable while things restart: try again
            error = e
        else:
            if value:
                self.value = value
                return None
        if time.monotonic() > self._deadline_s:
            detail = f" (last error: {error!r})" if error is not None else ""
            raise AssertionError(
                f"timed out after {self._timeout_s}s waiting for {self._message}{detail}"
            )
        pause_s = min(self._pause_s, self._max_pause_s)
        self._pause_s *= 2
        return pause_s
