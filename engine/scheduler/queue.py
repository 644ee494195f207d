"""Where each live request sits: the waiting queue, the running list, imports and pins.

Pure bookkeeping without policy — the scheduler decides, this module keeps the collections
consistent. The running list stays sorted by arrival, so its tail is always the latest-arrived
running request (the first preemption victim).
"""

from __future__ import annotations

import bisect
from collections import deque

from core.errors import InvalidRequestError
from engine.request import Request, RequestStatus


class RequestQueues:
    """Every request the scheduler still tracks, each in exactly one collection."""

    def __init__(self) -> None:
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.importing: dict[str, Request] = {}  # WAITING_FOR_KV
        self.pinned: dict[str, Request] = {}  # FINISHED_PREFILL, blocks held
        self.loading: dict[str, Request] = {}  # LOADING_KV: a lower-tier prefix copying back
        self.cancelled_loads: dict[str, Request] = {}  # ended while loading; blocks held until
        # the copy into them has finished
        self._next_arrival_seq = 0

    def register(self, request: Request) -> None:
        """Start tracking a new request; its id must be unused."""
        if request.request_id in self.requests:
            raise InvalidRequestError(
                f"request id {request.request_id!r} is already in use", param="request_id"
            )
        request.arrival_seq = self._next_arrival_seq
        self._next_arrival_seq += 1
        self.requests[request.request_id] = request

    def get(self, request_id: str) -> Request | None:
        """The tracked request with this id, if any."""
        return self.requests.get(request_id)

    def add_running(self, request: Request) -> None:
        """Insert into the running list at its arrival position."""
        keys = [r.arrival_seq for r in self.running]
        self.running.insert(bisect.bisect(keys, request.arrival_seq), request)

    def pop_latest_running(self) -> Request:
        """Remove and return the latest-arrived running request."""
        return self.running.pop()

    def detach(self, request: Request) -> None:
        """Remove the request from whichever collection holds it (it stays registered)."""
        status = request.status
        if status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif status is RequestStatus.WAITING_FOR_KV:
            self.importing.pop(request.request_id, None)
        elif status is RequestStatus.FINISHED_PREFILL:
            self.pinned.pop(request.request_id, None)
        elif status is RequestStatus.LOADING_KV:
            self.loading.pop(request.request_id, None)
        elif request in self.waiting:
            self.waiting.remove(request)

    def forget(self, request: Request) -> None:
        """Stop tracking a request that has been detached."""
        self.requests.pop(request.request_id, None)

    def has_unfinished(self) -> bool:
        """True while any request waits, runs, waits for imported KV or loads it from a tier
        (ended requests whose load is still copying included: their blocks are still held)."""
        return bool(
            self.waiting or self.running or self.importing or self.loading or self.cancelled_loads
        )

    def check_consistent(self) -> list[str]:
        """Problems found (empty when every request sits where its status says)."""
        problems: list[str] = []
        members: list[tuple[Request, set[RequestStatus]]] = [
            *((r, {RequestStatus.WAITING, RequestStatus.PREEMPTED}) for r in self.waiting),
            *((r, {RequestStatus.RUNNING}) for r in self.running),
            *((r, {RequestStatus.WAITING_FOR_KV}) for r in self.importing.values()),
            *((r, {RequestStatus.FINISHED_PREFILL}) for r in self.pinned.values()),
            *((r, {RequestStatus.LOADING_KV}) for r in self.loading.values()),
            *((r, {r.status} if r.is_finished else set()) for r in self.cancelled_loads.values()),
        ]
        seen: set[str] = set()
        for request, allowed in members:
            if request.status not in allowed:
                problems.append(f"request {request.request_id} is {request.status} in a queue")
            if request.request_id in seen:
                problems.append(f"request {request.request_id} is in two collections")
            seen.add(request.request_id)
        if seen != set(self.requests):
            problems.append(f"tracked {sorted(self.requests)} but queued {sorted(seen)}")
        arrivals = [r.arrival_seq for r in self.running]
        if arrivals != sorted(arrivals):
            problems.append("running list is not in arrival order")
        return problems
