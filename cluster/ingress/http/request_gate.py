"""Who gets in: API-key authentication, draining and the in-flight request cap.

:class:`RequestGate` is the ingress's runtime admission state. A request holds an
:class:`Admission` from the moment it is accepted until its response (or stream) ends; when the
cap is reached new requests get 429 with ``Retry-After``; once draining, 503. The deploy helper
calls :meth:`RequestGate.start_draining` on shutdown and :meth:`RequestGate.wait_idle` to let
the requests in flight finish.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Collection

from core.errors import AuthenticationError, OverloadedError, UnavailableError

_BEARER = "bearer "


def authenticate(authorization: str | None, api_keys: Collection[str]) -> None:
    """Accept the request when no keys are configured or it carries one of them.

    Raises :class:`AuthenticationError` for a missing or wrong ``Authorization: Bearer`` key.
    """
    if not api_keys:
        return
    if authorization is None or not authorization.lower().startswith(_BEARER):
        raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'")
    presented = authorization[len(_BEARER) :].strip().encode()
    # NOTE: compare against every key without short-circuiting, in constant time per key.
    matches = [hmac.compare_digest(presented, key.encode()) for key in api_keys]
    if not any(matches):
        raise AuthenticationError("invalid API key")


def tenant_salt(authorization: str | None) -> str | None:
    """A per-key cache salt: a digest of the bearer key (the key itself never leaves the
    ingress); ``None`` without a bearer key."""
    if authorization is None or not authorization.lower().startswith(_BEARER):
        return None
    key = authorization[len(_BEARER) :].strip().encode()
    return "key:" + hashlib.blake2b(key, digest_size=16, person=b"pdserve-salt").hexdigest()


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
