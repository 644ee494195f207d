"""Session affinity: which replica a conversation was last routed to, for a while.

The session id is the ``x-session-id`` header or else the OpenAI ``user`` field
(:func:`extract_session_id`); the ingress puts it in the request dict as ``session_id``.
:class:`SessionAffinity` remembers each session's last replica for ``ttl_s`` after its last
request; the policy decides whether the pin still holds (it yields to overload). Memory is
bounded by ``max_sessions`` (least recently used sessions are forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from cluster.routing.policy_types import SessionPin

SESSION_HEADER = "x-session-id"
MAX_SESSION_ID_CHARS = 256


def extract_session_id(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The ``x-session-id`` header (any case), else a string ``user`` field, else ``None``;
    ids longer than :data:`MAX_SESSION_ID_CHARS` are cut."""
    for key, value in headers.items():
        if key.lower() == SESSION_HEADER and value:
            return value[:MAX_SESSION_ID_CHARS]
    user = body.get("user")
    if isinstance(user, str) and user:
        return user[:MAX_SESSION_ID_CHARS]
    return None


class SessionAffinity:
    """A bounded LRU map ``session_id -> SessionPin`` with a TTL."""

    def __init__(self, ttl_s: float = 300.0, max_sessions: int = 100_000) -> None:
        if ttl_s < 0 or max_sessions < 1:
            raise ValueError("session affinity needs ttl_s >= 0 and max_sessions >= 1")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._pins: OrderedDict[str, SessionPin] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pins)

    def pin_for(self, session_id: str | None, now_s: float) -> SessionPin | None:
        """The session's live pin (``None`` without a session, a pin, or once it expired)."""
        if session_id is None:
            return None
        pin = self._pins.get(session_id)
        if pin is None:
            return None
        if pin.expires_at_s <= now_s:
            del self._pins[session_id]
            return None
        return pin

    def record(self, session_id: str | None, replica_id: str, now_s: float) -> None:
        """Pin the session to the replica it was just routed to, for ``ttl_s`` from now."""
        if session_id is None or self.ttl_s == 0:
            return
        self._pins[session_id] = SessionPin(replica_id, now_s + self.ttl_s)
        self._pins.move_to_end(session_id)
        while len(self._pins) > self.max_sessions:
            self._pins.popitem(last=False)

    def forget_replica(self, replica_id: str) -> int:
        """Drop every pin to a replica that went away; returns how many."""
        stale = [sid for sid, pin in self._pins.items() if pin.replica_id == replica_id]
        for session_id in stale:
            del self._pins[session_id]
        return len(stale)
