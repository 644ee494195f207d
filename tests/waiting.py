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
from typing import TypeVar

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
    deadline = time.monotonic() + timeout_s
    pause = _FIRST_POLL_S
    while True:
        value, error = _poll(predicate)
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout_s, message, error)
        time.sleep(min(pause, poll_s))
        pause *= 2


async def async_wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 5.0,
    message: str = "condition",
    poll_s: float = _MAX_POLL_S,
) -> T:
    """:func:`wait_until` on an event loop: the loop runs between polls."""
    deadline = time.monotonic() + timeout_s
    pause = _FIRST_POLL_S
    while True:
        value, error = _poll(predicate)
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout_s, message, error)
        await asyncio.sleep(min(pause, poll_s))
        pause *= 2


def _poll(predicate: Callable[[], T]) -> tuple[T | None, Exception | None]:
    try:
        return predicate(), None
    except Exception as e:
        return None, e


def _timed_out(timeout_s: float, message: str, error: Exception | None) -> AssertionError:
    detail = f" (last error: {error!r})" if error is not None else ""
    return AssertionError(f"timed out after {timeout_s}s waiting for {message}{detail}")
