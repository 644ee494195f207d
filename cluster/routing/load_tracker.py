"""The router's own, always-fresh view of the load it sent to each replica.

Replica-reported stats arrive every ``request_routing_stats_period_s``; between two reports a
burst would all land on the same "idle" replica. So the router counts what it routed itself:
:meth:`LoadTracker.begin` when it ranks a request (the first choice is assumed),
:meth:`LoadTracker.move` when Serve reports the replica it actually used, and
:meth:`LoadTracker.finish` when the request completes. Entries that never finish (a request
cancelled before it was sent) are dropped after ``ttl_s``, and at most ``max_requests`` are
kept, so memory stays bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _InFlight:
    replica_id: str
    num_tokens: int
    started_s: float


class LoadTracker:
    """Requests and tokens in flight per replica, as routed by this router."""

    def __init__(self, *, ttl_s: float = 600.0, max_requests: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_requests = max_requests
        self._requests: OrderedDict[str, _InFlight] = OrderedDict()  # oldest first
        self._num_requests: dict[str, int] = {}
        self._num_tokens: dict[str, int] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def begin(self, request_id: str, replica_id: str, num_tokens: int, now_s: float) -> bool:
        """Count a request against ``replica_id``; returns False when it was already counted
        (a retried routing attempt: the old replica is uncounted first)."""
        previous = self._requests.pop(request_id, None)
        if previous is not None:
            self._add(previous.replica_id, -1, -previous.num_tokens)
        self._requests[request_id] = _InFlight(replica_id, num_tokens, now_s)
        self._add(replica_id, 1, num_tokens)
        self._expire(now_s)
        return previous is None

    def move(self, request_id: str, replica_id: str) -> None:
        """The request actually went to ``replica_id`` (Serve fell back to a later rank)."""
        entry = self._requests.get(request_id)
        if entry is None or entry.replica_id == replica_id:
            return
        self._add(entry.replica_id, -1, -entry.num_tokens)
        entry.replica_id = replica_id
        self._add(replica_id, 1, entry.num_tokens)

    def finish(self, request_id: str) -> None:
        """The request completed (or failed); its load is gone."""
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            self._add(entry.replica_id, -1, -entry.num_tokens)

    def forget_replica(self, replica_id: str) -> None:
        """Drop every request counted against a replica that went away."""
        for request_id in [r for r, e in self._requests.items() if e.replica_id == replica_id]:
            self.finish(request_id)

    def num_requests(self, replica_id: str) -> int:
        """Requests in flight to ``replica_id``."""
        return self._num_requests.get(replica_id, 0)

    def num_tokens(self, replica_id: str) -> int:
        """Tokens of work in flight to ``replica_id``."""
        return self._num_tokens.get(replica_id, 0)

    def _add(self, replica_id: str, num_requests: int, num_tokens: int) -> None:
        requests = self._num_requests.get(replica_id, 0) + num_requests
        if requests <= 0:
            self._num_requests.pop(replica_id, None)
            self._num_tokens.pop(replica_id, None)
            return
        self._num_requests[replica_id] = requests
        self._num_tokens[replica_id] = self._num_tokens.get(replica_id, 0) + num_tokens

    def _expire(self, now_s: float) -> None:
        while self._requests:
            request_id, oldest = next(iter(self._requests.items()))
            if len(self._requests) <= self.max_requests and now_s - oldest.started_s < self.ttl_s:
                break
            self.finish(request_id)
