"""Admission: draining and the in-flight request cap.

:class:`RequestGate` is the ingress's runtime admission state. A request holds an
:class:`Admission` from the moment it is accepted until its response (or stream) ends; when the
cap is reached new requests get 429 with ``Retry-After``; once draining, 503. The deploy helper
calls :meth:`RequestGate.start_draining` on shutdown and :meth:`RequestGate.wait_idle` to let
the requests in flight finish.
"""

from __future__ import annotations

import asyncio

from core.errors import OverloadedError, UnavailableError


class Admission:
    """One admitted request's slot; :meth:`release` is idempotent."""

    def __init__(self, gate: RequestGate) -> None:
        self._gate = gate
        self._released = False

    def release(self) -> None:
        """Give the slot back (safe to call more than once)."""
        if not self._released:
            self._released = True
            self._gate._on_release()


class RequestGate:
    """Draining flag and in-flight count of one ingress replica (single event loop)."""

    def __init__(self, max_in_flight_requests: int, retry_after_s: float = 1.0) -> None:
        self._max_in_flight = max_in_flight_requests
        self._retry_after_s = retry_after_s
        self._num_in_flight = 0
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def num_in_flight(self) -> int:
        """Requests admitted and not yet finished."""
        return self._num_in_flight

    @property
    def draining(self) -> bool:
        """True once :meth:`start_draining` was called (new requests get 503)."""
        return self._draining

    def start_draining(self) -> None:
        """Refuse new requests with 503; those in flight continue."""
        self._draining = True

    def stop_draining(self) -> None:
        """Accept new requests again."""
        self._draining = False

    def admit(self) -> Admission:
        """A slot for a new request; raises 503 while draining and 429 over the cap."""
        if self._draining:
            raise UnavailableError("the server is draining; retry on another replica")
        if self._num_in_flight >= self._max_in_flight:
            raise OverloadedError(
                f"too many requests in flight ({self._max_in_flight}); retry later",
                retry_after_s=self._retry_after_s,
            )
        self._num_in_flight += 1
        self._idle.clear()
        return Admission(self)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False when ``timeout_s`` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _on_release(self) -> None:
        self._num_in_flight -= 1
        if self._num_in_flight == 0:
            self._idle.set()
